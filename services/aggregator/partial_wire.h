#pragma once

// A partial sum on the wire (AggregatorService.PushPartial): a PartialMeta, then the sum's
// values as little-endian bytes: float32, or for an exact sum 128-bit two's complement integers
// in units of 2^-64. Those are the values' in-memory layouts on a little-endian host (the only
// kind Shoal builds for), so a sender streams straight from the sum's memory and a receiver
// copies each chunk once, into the sum it returns.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/aggregation/weighted_mean.h"
#include "services/aggregator/aggregator_core.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// The bytes of `sum`'s values as they travel (a view of its memory).
absl::string_view PartialBytes(const aggregation::PartialSum& sum);

// The meta that sends `partial` to a parent as child `child` (with the bytes' digest).
v1::PartialMeta PartialMetaFor(const PartialResult& partial, const std::string& child);

// Receives one partial sum: Start with its meta, Add its chunks, Finish.
class PartialReceiver {
 public:
  // `values`: the round's model size. INVALID_ARGUMENT when the meta disagrees with it, names a
  // contributor count the sum's terms cannot match, or has a malformed weight.
  static absl::StatusOr<PartialReceiver> Start(const v1::PartialMeta& meta, size_t values);

  // INVALID_ARGUMENT for bytes past the sum's size.
  absl::Status Add(absl::string_view chunk);
  // INVALID_ARGUMENT when bytes are missing or their digest is not the meta's. The values
  // themselves are checked when the sum is added (AggregatorCore::AddPartial).
  absl::StatusOr<PartialResult> Finish() &&;

  uint64_t bytes_received() const { return received_; }

 private:
  PartialReceiver() = default;
  char* data();

  PartialResult result_;
  uint64_t digest_ = 0;
  size_t size_ = 0;
  size_t received_ = 0;
};

}  // namespace shoal::aggregator
