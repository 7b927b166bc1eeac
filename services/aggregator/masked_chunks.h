#pragma once

// Step 3 of AggregatorService.SecureAggregate across several messages. A masked update holds 4
// bytes per model value, more than one message may carry (8 MiB here) once a model passes about
// two million values, so a peer sends it as a run of `masked` messages: the first carries
// num_samples, train_loss, train_ms and the first values; each later one only participant_id
// and the values that follow; the values concatenate, in order, to the round's vector_length x 4
// bytes. A model that fits one chunk may travel as one message, as before; shoal's peers
// (GrpcAggregatorClient) write 256 KiB chunks, whose serialized copies reuse memory.

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// The values one `masked` message carries at most: 1,048,576 ring values.
inline constexpr size_t kMaskedChunkBytes = size_t{4} << 20;

// Writes `request` through `write`: as it is unless it is a masked update whose values exceed
// `chunk_bytes`, else as that update's chunks. Stops at the first write that returns false and
// returns false.
bool WriteMaskedInChunks(v1::SecureAggregationRequest request,
                         const std::function<bool(const v1::SecureAggregationRequest&)>& write,
                         size_t chunk_bytes = kMaskedChunkBytes);

// As WriteMaskedInChunks, the same messages, and `request` is left as it was (its values' buffer
// with it, for the caller to reuse).
bool WriteMaskedChunksOf(v1::SecureAggregationRequest& request,
                         const std::function<bool(const v1::SecureAggregationRequest&)>& write,
                         size_t chunk_bytes);

// Puts one peer's masked update back together on the aggregator's side of its stream.
// Not thread-safe; one per stream.
class MaskedUpdateAssembler {
 public:
  // `update_bytes`: the round's vector_length x 4.
  explicit MaskedUpdateAssembler(size_t update_bytes) : update_bytes_(update_bytes) {}

  // Takes one `masked` message. The whole update once its values reach update_bytes; nullopt
  // while more are owed. INVALID_ARGUMENT: the values pass update_bytes, or a chunk names another
  // participant than the first. After the whole update it starts afresh.
  absl::StatusOr<std::optional<v1::SecureAggregationRequest>> Add(
      v1::SecureAggregationRequest message);

 private:
  const size_t update_bytes_;
  std::optional<v1::SecureAggregationRequest> pending_;
};

}  // namespace shoal::aggregator
