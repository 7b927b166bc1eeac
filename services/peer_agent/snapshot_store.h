#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "libs/tensor/flat_model.h"

namespace shoal::peer {

// The latest parameters this peer published, as an immutable snapshot: the agent's worker
// publishes, PeerService readers stream a snapshot without ever blocking training.
struct Snapshot {
  std::string task;
  uint64_t version = 0;  // global model version the parameters derive from
  std::shared_ptr<const tensor::FlatModel> model;
};

// Holds the latest Snapshot. Owned by the PeerServer, shared by the agent and the service.
// Thread-safe.
class SnapshotStore {
 public:
  void Publish(Snapshot snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);
  // The latest snapshot, if any.
  std::optional<Snapshot> Latest() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::optional<Snapshot> latest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::peer
