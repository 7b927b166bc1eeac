#include "libs/capacity/upload_probe.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/status.h"

namespace shoal::capacity {

namespace {

// One MeasureUpload call of `bytes`; the seconds from its start to the answer.
absl::StatusOr<double> TimedUpload(coordinator::v1::SessionService::StubInterface& stub,
                                   grpc::ClientContext& context, uint64_t bytes) {
  constexpr uint64_t kChunk = 256 << 10;  // of 16 KiB to 4 MiB, the fastest on 127.0.0.1
  coordinator::v1::UploadProbe probe;
  probe.mutable_payload()->assign(static_cast<size_t>(std::min(bytes, kChunk)), '\x5a');
  coordinator::v1::UploadProbeResult result;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientWriterInterface<coordinator::v1::UploadProbe>> writer =
      stub.MeasureUpload(&context, &result);
  for (uint64_t sent = 0; sent < bytes;) {
    const uint64_t n = std::min(kChunk, bytes - sent);
    if (n != probe.payload().size()) probe.mutable_payload()->resize(static_cast<size_t>(n));
    if (!writer->Write(probe)) break;  // Finish says why
    sent += n;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  if (result.bytes() != bytes) {
    return absl::InternalError(absl::StrCat("MeasureUpload: the coordinator counted ",
                                            result.bytes(), " bytes of ", bytes));
  }
  return seconds;
}

}  // namespace

absl::StatusOr<double> MeasureUpload(coordinator::v1::SessionService::StubInterface& stub,
                                     grpc::ClientContext& context, uint64_t bytes) {
  // A small call first, so that the connection (and the TLS handshake) is not timed. It has a
  // context of its own (a context serves one call), with a short deadline: a cancel of
  // `context` while it runs takes effect on the timed call.
  {
    grpc::ClientContext warm_up;
    warm_up.set_deadline(
        std::min(context.deadline(), std::chrono::system_clock::now() + std::chrono::seconds(5)));
    SHOAL_RETURN_IF_ERROR(TimedUpload(stub, warm_up, std::min<uint64_t>(bytes, 64 << 10)).status());
  }
  SHOAL_ASSIGN_OR_RETURN(const double seconds, TimedUpload(stub, context, bytes));
  return static_cast<double>(bytes) / std::max(seconds, 1e-6);
}

UploadProbeOutcome LogUploadProbe(const absl::StatusOr<double>& rate,
                                  const std::string& coordinator, uint64_t bytes) {
  if (rate.ok()) {
    LogInfo("upload to coordinator ", coordinator, ": ", absl::StrFormat("%.1f MB/s", *rate / 1e6),
            " (", bytes, " bytes timed)");
    return UploadProbeOutcome::kMeasured;
  }
  if (rate.status().code() == absl::StatusCode::kUnavailable) return UploadProbeOutcome::kRetry;
  LogWarning("cannot measure the upload to coordinator ", coordinator, ": ",
             rate.status().ToString(), " (reported as unmeasured)");
  return UploadProbeOutcome::kGiveUp;
}

}  // namespace shoal::capacity
