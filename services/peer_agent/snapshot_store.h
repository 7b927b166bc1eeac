#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "shoal/common/v1/model.pb.h"
#include "shoal/peer/v1/peer.pb.h"

namespace shoal::peer {

// Parameters this peer published, as an immutable snapshot: the agent's worker (or a mode
// runner) publishes, PeerService readers stream a snapshot without ever blocking training.
// Field order: designated initializers must follow it ({.task, .version, .model, .kind, ...}).
struct Snapshot {
  std::string task;
  uint64_t version = 0;  // LATEST: global model version (federated) or step count (gossip)
  std::shared_ptr<const tensor::FlatModel> model;
  // Which slot of the store this snapshot fills (federated and gossip: LATEST; decentralized:
  // ROUND_UPDATE for the weights trained in `round`, GLOBAL for the averaged model of `round`).
  peer::v1::SnapshotKind kind = peer::v1::SNAPSHOT_KIND_LATEST;
  uint64_t round = 0;        // ROUND_UPDATE / GLOBAL: the round (served as ModelMeta.version)
  uint64_t num_samples = 0;  // ROUND_UPDATE: samples the update was trained on
  double clock = 0;          // gossip: the peer's clock
  double loss = 0;           // gossip: recent training loss
  // ROUND_UPDATE of a task with compression: `model` is the update decoded (trained weights
  // minus the round's base, as every participant folds it) and `encoded` what is served.
  std::shared_ptr<const tensor::EncodedModel> encoded = nullptr;
};

// Holds the latest Snapshot of each kind (LATEST, ROUND_UPDATE, GLOBAL) and, for GLOBAL, the one
// of the round before until DropGlobalsBefore lets it go: a decentralized peer publishes a
// round's averaged model as soon as it has it, while the coordinator may still send joiners to
// it for the round before (the round is not complete yet, or its attempt failed and joins
// opened again). Owned by the PeerServer, shared by the agent, the mode runners and the service.
// Thread-safe; snapshots are shared immutable models, so readers never copy parameters under the
// lock.
class SnapshotStore {
 public:
  // Replaces the snapshot of `snapshot.kind`; a GLOBAL of a later round keeps the one it
  // replaces as the previous round's. An unknown kind is ignored.
  void Publish(Snapshot snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops every snapshot (a new task).
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the snapshot of one kind (for GLOBAL, the previous round's too).
  void Clear(peer::v1::SnapshotKind kind) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the previous round's GLOBAL when its round is before `round` (the coordinator
  // completed `round`: nobody is sent to this peer for an earlier one).
  void DropGlobalsBefore(uint64_t round) ABSL_LOCKS_EXCLUDED(mu_);
  // The snapshot of `kind`, if any.
  std::optional<Snapshot> Get(peer::v1::SnapshotKind kind) const ABSL_LOCKS_EXCLUDED(mu_);
  // Get(SNAPSHOT_KIND_LATEST).
  std::optional<Snapshot> Latest() const { return Get(peer::v1::SNAPSHOT_KIND_LATEST); }

  // What PeerService.GetSnapshot answers `request` with: the snapshot and the ModelMeta that
  // starts its stream (version = the round for ROUND_UPDATE/GLOBAL; the snapshot's `encoded` when
  // set, with ModelMeta.delta, else its model raw). Errors: INVALID_ARGUMENT an
  // unknown kind; NOT_FOUND nothing of that kind (or of that task) published; FAILED_PRECONDITION
  // a snapshot of another round (GLOBAL: of neither round held).
  struct Served {
    std::shared_ptr<const tensor::EncodedModel> model;
    common::v1::ModelMeta meta;
  };
  absl::StatusOr<Served> Serve(const peer::v1::GetSnapshotRequest& request) const;

 private:
  static constexpr int kKinds = 3;
  static int Slot(peer::v1::SnapshotKind kind);  // -1 for an unknown kind

  struct Stored {
    Snapshot snapshot;
    // Its model's tensors' digests, computed by the first raw serve and kept for the later ones
    // (a decentralized round's update is served to every other participant).
    std::shared_ptr<tensor::TensorDigests> digests = std::make_shared<tensor::TensorDigests>();
  };

  mutable absl::Mutex mu_;
  std::optional<Stored> slots_[kKinds] ABSL_GUARDED_BY(mu_);
  std::optional<Stored> previous_global_ ABSL_GUARDED_BY(mu_);  // the round before GLOBAL's
};

}  // namespace shoal::peer
