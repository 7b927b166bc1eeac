#include "services/peer_agent/snapshot_store.h"

#include <utility>

namespace shoal::peer {

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
  std::optional<Snapshot> old;  // released outside the lock (may free a model)
  absl::MutexLock lock(&mu_);
  old = std::move(slots_[slot]);
  slots_[slot] = std::move(snapshot);
}

void SnapshotStore::Clear() {
  std::optional<Snapshot> old[kKinds];
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < kKinds; ++i) {
    old[i] = std::move(slots_[i]);
    slots_[i].reset();
  }
}

void SnapshotStore::Clear(peer::v1::SnapshotKind kind) {
  const int slot = Slot(kind);
  if (slot < 0) return;
  std::optional<Snapshot> old;
  absl::MutexLock lock(&mu_);
  old = std::move(slots_[slot]);
  slots_[slot].reset();
}

std::optional<Snapshot> SnapshotStore::Get(peer::v1::SnapshotKind kind) const {
  const int slot = Slot(kind);
  if (slot < 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  return slots_[slot];
}

}  // namespace shoal::peer
