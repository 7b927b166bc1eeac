#include "services/peer_agent/snapshot_store.h"

#include <utility>

namespace shoal::peer {

void SnapshotStore::Publish(Snapshot snapshot) {
  absl::MutexLock lock(&mu_);
  latest_ = std::move(snapshot);
}

void SnapshotStore::Clear() {
  absl::MutexLock lock(&mu_);
  latest_.reset();
}

std::optional<Snapshot> SnapshotStore::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

}  // namespace shoal::peer
