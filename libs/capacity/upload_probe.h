#pragma once

#include <grpcpp/client_context.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"

namespace shoal::capacity {

// The coordinator's limits for SessionService.MeasureUpload.
inline constexpr uint64_t kMaxUploadProbeBytes = 64ull << 20;
inline constexpr uint64_t kMaxUploadProbeChunk = 4ull << 20;

// Streams `bytes` to the coordinator (SessionService.MeasureUpload, chunks of 256 KiB) after a
// small untimed call that opens the connection, and returns
// the bytes per second from the first write to the coordinator's answer. `context` carries the
// deadline and lets another thread cancel. Errors: the call's, or INTERNAL when the coordinator
// counted other than `bytes`.
absl::StatusOr<double> MeasureUpload(coordinator::v1::SessionService::StubInterface& stub,
                                     grpc::ClientContext& context, uint64_t bytes);

// What a node's start-up loop does after a MeasureUpload, which LogUploadProbe logs.
enum class UploadProbeOutcome {
  kMeasured,  // report the rate
  kRetry,     // UNAVAILABLE: the connection attempt that follows fails too; measure again then
  kGiveUp,    // any other error (an older coordinator, a link too slow for the timeout): report
              // the upload as unmeasured
};
UploadProbeOutcome LogUploadProbe(const absl::StatusOr<double>& rate,
                                  const std::string& coordinator, uint64_t bytes);

}  // namespace shoal::capacity
