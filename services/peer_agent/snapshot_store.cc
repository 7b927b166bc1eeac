#include "services/peer_agent/snapshot_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/tensor/frame_codec.h"

namespace shoal::peer {
namespace {

const char* KindName(peer::v1::SnapshotKind kind) {
  switch (kind) {
    case peer::v1::SNAPSHOT_KIND_LATEST:
      return "LATEST";
    case peer::v1::SNAPSHOT_KIND_ROUND_UPDATE:
      return "ROUND_UPDATE";
    case peer::v1::SNAPSHOT_KIND_GLOBAL:
      return "GLOBAL";
    default:
      return "unknown";
  }
}

}  // namespace

int SnapshotStore::Slot(peer::v1::SnapshotKind kind) {
  switch (kind) {
    case peer::v1::SNAPSHOT_KIND_LATEST:
      return 0;
    case peer::v1::SNAPSHOT_KIND_ROUND_UPDATE:
      return 1;
    case peer::v1::SNAPSHOT_KIND_GLOBAL:
      return 2;
    default:
      return -1;
  }
}

void SnapshotStore::Publish(Snapshot snapshot) {
  const int slot = Slot(snapshot.kind);
  if (slot < 0) return;
  std::optional<Stored> old;  // released outside the lock (may free a model)
  std::optional<Stored> older;
  const bool global = snapshot.kind == peer::v1::SNAPSHOT_KIND_GLOBAL;
  Stored stored;
  stored.snapshot = std::move(snapshot);
  absl::MutexLock lock(&mu_);
  old = std::move(slots_[slot]);
  slots_[slot] = std::move(stored);
  if (!global) return;
  older = std::move(previous_global_);
  previous_global_.reset();
  if (old.has_value() && old->snapshot.round < slots_[slot]->snapshot.round) {
    previous_global_ = std::move(old);
  }
}

void SnapshotStore::Clear() {
  std::optional<Stored> old[kKinds];
  std::optional<Stored> older;
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < kKinds; ++i) {
    old[i] = std::move(slots_[i]);
    slots_[i].reset();
  }
  older = std::move(previous_global_);
  previous_global_.reset();
}

void SnapshotStore::DropGlobalsBefore(uint64_t round) {
  std::optional<Stored> older;
  absl::MutexLock lock(&mu_);
  if (previous_global_.has_value() && previous_global_->snapshot.round < round) {
    older = std::move(previous_global_);
    previous_global_.reset();
  }
}

void SnapshotStore::Clear(peer::v1::SnapshotKind kind) {
  const int slot = Slot(kind);
  if (slot < 0) return;
  std::optional<Stored> old;
  std::optional<Stored> older;
  absl::MutexLock lock(&mu_);
  old = std::move(slots_[slot]);
  slots_[slot].reset();
  if (kind != peer::v1::SNAPSHOT_KIND_GLOBAL) return;
  older = std::move(previous_global_);
  previous_global_.reset();
}

std::optional<Snapshot> SnapshotStore::Get(peer::v1::SnapshotKind kind) const {
  const int slot = Slot(kind);
  if (slot < 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (!slots_[slot].has_value()) return std::nullopt;
  return slots_[slot]->snapshot;
}

absl::StatusOr<SnapshotStore::Served> SnapshotStore::Serve(
    const peer::v1::GetSnapshotRequest& request) const {
  const peer::v1::SnapshotKind kind = request.kind();
  if (!peer::v1::SnapshotKind_IsValid(kind) || Slot(kind) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown snapshot kind ", static_cast<int>(kind)));
  }
  std::optional<Stored> stored;
  {
    // Both slots as they are at one instant (a publish moves the global into previous_global_).
    absl::MutexLock lock(&mu_);
    stored = slots_[Slot(kind)];
    if (stored.has_value() && kind == peer::v1::SNAPSHOT_KIND_GLOBAL &&
        request.round() != stored->snapshot.round && previous_global_.has_value() &&
        previous_global_->snapshot.round == request.round()) {
      stored = previous_global_;
    }
  }
  Snapshot* snapshot = stored.has_value() ? &stored->snapshot : nullptr;
  if (snapshot == nullptr || !snapshot->model) {
    return absl::NotFoundError(
        absl::StrCat("this peer has published no ", KindName(kind), " snapshot yet"));
  }
  if (!request.task().empty() && request.task() != snapshot->task) {
    return absl::NotFoundError(absl::StrCat("this peer has no snapshot of task \"", request.task(),
                                            "\" (it has \"", snapshot->task, "\")"));
  }
  const bool by_round = kind != peer::v1::SNAPSHOT_KIND_LATEST;
  if (by_round && request.round() != snapshot->round) {
    return absl::FailedPreconditionError(absl::StrCat("asked for the ", KindName(kind),
                                                      " snapshot of round ", request.round(),
                                                      ", this peer holds round ", snapshot->round));
  }
  Served served;
  served.meta = tensor::MakeModelMeta(
      snapshot->task, by_round ? snapshot->round : snapshot->version, *snapshot->model);
  served.meta.set_num_samples(snapshot->num_samples);
  served.meta.set_clock(snapshot->clock);
  served.meta.set_loss(snapshot->loss);
  if (snapshot->encoded != nullptr) {
    served.meta.set_total_bytes(snapshot->encoded->payload_bytes());
    served.meta.set_delta(true);
    served.model = std::move(snapshot->encoded);
  } else {
    // Outside the lock: the first serve hashes the model's tensors.
    served.model = tensor::EncodeRaw(snapshot->model, stored->digests->Of(*snapshot->model));
  }
  return served;
}

}  // namespace shoal::peer
