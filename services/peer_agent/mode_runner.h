#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "libs/privacy/secagg/identity.h"
#include "services/peer_agent/peer_hooks.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal {
class Clock;  // libs/common/clock.h
namespace aggregator {
class AggregatorClient;  // services/aggregator/aggregator_client.h
}  // namespace aggregator
namespace rpc {
class Wakeup;  // libs/rpc/retry.h
}  // namespace rpc
namespace training {
class Trainer;  // libs/training/trainer.h
}  // namespace training
}  // namespace shoal

namespace shoal::peer {

class PeerClient;     // services/peer_agent/peer_client.h
class SnapshotStore;  // services/peer_agent/snapshot_store.h
struct PeerMetrics;   // services/peer_agent/peer_metrics.h

// What a ModeRunner works with. PeerAgent fills it (so does the static gossip peer); everything
// referenced must outlive the runner. A mode's factory checks that what it needs is there.
struct ModeRunnerDeps {
  coordinator::v1::TaskAssigned assigned;  // the task; its spec's mode picked the runner
  training::Trainer* trainer = nullptr;    // this peer's model and data; the worker thread only
  SnapshotStore* snapshots = nullptr;      // where the runner publishes what other peers fetch
  PeerClient* peers = nullptr;             // other peers' PeerService (decentralized, gossip)
  aggregator::AggregatorClient* aggregator = nullptr;  // the aggregator (federated modes)
  PeerMetrics* metrics = nullptr;
  const Clock* clock = nullptr;
  // Notified whenever a keep_going predicate handed to the runner may have turned false (an
  // event was queued, the agent stops); every wait of the runner sleeps on it. Its clock is
  // `clock`.
  rpc::Wakeup* wakeup = nullptr;
  std::string peer_id;  // this peer
  // Secure aggregation: the identity key this peer made for its session, which signs its
  // advertised keys, and its public half (Hello.identity_public_key). Null: none.
  std::shared_ptr<const privacy::secagg::KeySigner> identity;
  std::string identity_public_key;
  // Where the federated modes keep the global model on disk, and the decentralized mode the round
  // updates that wait for their turn (--scratch-dir; empty: TMPDIR, else /tmp).
  std::string scratch_dir;
  // Where a decentralized peer keeps the model of the last round it completed, to hold it again
  // after a restart (--state-dir; empty: nowhere, KeptModel).
  std::string state_dir;
  // Federated-sync (--evaluate-beside-training): whether a published model is evaluated on a
  // thread of its own beside the next round's training, or before it (FederatedSyncRunner).
  bool evaluate_beside_training = true;
  // Federated modes (--download-against-held): a global model's download names the version held
  // (AggregatorPeer::LoadGlobal), so it may come as the XOR with it; false: always raw.
  bool download_against_held = false;
  // The session token of the latest Welcome (aggregator calls carry it). Null: none.
  std::function<std::string()> session_token;
  // False once the task is over for this peer (TaskFinished or another TaskAssigned queued, the
  // session lost, the agent stopping): bounds work that a newer round must not interrupt (an
  // upload of the initial model). Null: always true.
  std::function<bool()> task_current;
  // What this peer contributes passes through these on its way out; empty (the default) in
  // shoal-peer, filled by its test build (peer_hooks.h).
  UpdateHooks update_hooks;
  // This peer's upload as its session measured it (bytes/s; null or 0: not measured), the
  // decentralized mode's guess at its links before its first fetches.
  std::shared_ptr<const std::atomic<double>> measured_upload;
  // Sends a message on the session; the host fills in PeerMessage.task, so runners leave it
  // empty. May be a no-op (static gossip without a coordinator).
  std::function<void(const coordinator::v1::PeerMessage&)> send;
};

// What a mode's runner needs of ModeRunnerDeps besides the trainer, the snapshot store, the
// metrics, the clock and the wakeup, which every runner needs.
struct RunnerNeeds {
  bool aggregator = false;  // an AggregatorClient
  bool peers = false;       // a PeerClient
  bool send = true;         // a session to send on
};

// For a mode's factory: INVALID_ARGUMENT, naming the mode, unless `deps` holds what a runner of
// `mode` needs and the assigned task is in `mode`.
absl::Status CheckRunnerDeps(const ModeRunnerDeps& deps, common::v1::Mode mode, RunnerNeeds needs);

// The peer-side logic of one task in one training mode (federated-sync, federated-async,
// decentralized, gossip; services/peer_agent/modes/<mode>/). PeerAgent, the mode-agnostic host,
// creates one through the mode registry (mode_registry.h) when a task is assigned (it owns the
// trainer, the data and the snapshot store and hands them over in ModeRunnerDeps) and destroys
// it when the task ends.
// Every event of the task reaches the runner, a repeated TaskAssigned of the same task included
// (e.g. with a new aggregator address).
//
// Threading: Intercept() and Supersedes() are called on the session reader thread and must not
// block; everything else runs on the agent's single worker thread, in event order.
class ModeRunner {
 public:
  virtual ~ModeRunner() = default;

  // Called once on the worker right after creation (e.g. send ModelHeld).
  virtual void Start() {}

  // Called once on the worker when the coordinator says the task is over (TaskFinished), right
  // before the runner is destroyed (e.g. remove what was kept on disk for a restart).
  virtual void Finished() {}

  // A coordinator event for this task, in order. Long work (training, fetching) checks
  // `keep_going` between steps and returns early when it turns false: a newer event that
  // supersedes this one is queued, the task ended, or the agent stops.
  virtual void Handle(const coordinator::v1::CoordinatorEvent& event,
                      const std::function<bool()>& keep_going) = 0;

  // Session reader thread: sees each event of this task before it is queued. Returns true when
  // the event is consumed here and must not be queued (e.g. a gossip membership update applied
  // at once while the worker trains). Must not block.
  virtual bool Intercept(const coordinator::v1::CoordinatorEvent& event) { return false; }

  // Session reader thread: whether `event`, once queued, should make the current Handle() stop
  // (its keep_going turns false). TaskAssigned and TaskFinished always do. Must not block.
  virtual bool Supersedes(const coordinator::v1::CoordinatorEvent& event) const { return false; }
};

}  // namespace shoal::peer
