#include "services/peer_agent/peer_client.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::peer {

absl::Status CheckSnapshotMeta(const common::v1::ModelMeta& meta,
                               const peer::v1::GetSnapshotRequest& request,
                               const tensor::ModelLayout& expected) {
  if (!request.task().empty() && meta.task() != request.task()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "asked for a snapshot of task \"", request.task(), "\", got \"", meta.task(), "\""));
  }
  if (request.kind() != peer::v1::SNAPSHOT_KIND_LATEST && meta.version() != request.round()) {
    return absl::InvalidArgumentError(absl::StrCat("asked for round ", request.round(),
                                                   ", got a snapshot of round ", meta.version()));
  }
  if (meta.delta() && request.kind() != peer::v1::SNAPSHOT_KIND_ROUND_UPDATE) {
    return absl::InvalidArgumentError(
        "got a compressed delta, but only a decentralized round update may be one");
  }
  // A compressed delta is never larger than the model raw (its sender falls back to raw).
  if (meta.num_tensors() != expected.num_tensors() ||
      (meta.delta() ? meta.total_bytes() > expected.total_bytes()
                    : meta.total_bytes() != expected.total_bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot has ", meta.num_tensors(), " tensors / ", meta.total_bytes(),
                     " bytes, this task's model has ", expected.num_tensors(), " / ",
                     expected.total_bytes(), " (", expected.DebugString(), ")"));
  }
  return absl::OkStatus();
}

void CallCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (abort_) abort_();
}

bool CallCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool CallCanceller::Attach(std::function<void()> abort) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  abort_ = std::move(abort);
  return true;
}

void CallCanceller::Detach() {
  absl::MutexLock lock(&mu_);
  abort_ = nullptr;
}

}  // namespace shoal::peer
