#pragma once

#include <functional>
#include <string>

#include "shoal/coordinator/v1/session.pb.h"

namespace shoal {
class Clock;  // libs/common/clock.h
namespace training {
class Trainer;  // libs/training/trainer.h
}  // namespace training
}  // namespace shoal

namespace shoal::peer {

class PeerClient;     // services/peer_agent/peer_client.h
class SnapshotStore;  // services/peer_agent/snapshot_store.h
struct PeerMetrics;   // services/peer_agent/peer_metrics.h

// What a ModeRunner works with (PeerAgent fills it; the static gossip mode too). Everything
// referenced must outlive the runner.
struct ModeRunnerDeps {
  coordinator::v1::TaskAssigned assigned;  // the task; its spec's mode picks the runner
  training::Trainer* trainer = nullptr;    // this peer's model and data; the worker thread only
  SnapshotStore* snapshots = nullptr;      // where the runner publishes what other peers fetch
  PeerClient* peers = nullptr;             // fetches other peers' snapshots, probes them
  PeerMetrics* metrics = nullptr;
  const Clock* clock = nullptr;
  std::string peer_id;  // this peer
  // Sends a message on the session. May be a no-op (static gossip without a coordinator).
  std::function<void(const coordinator::v1::PeerMessage&)> send;
};

// The peer-side logic of one task in a mode other than federated-sync (decentralized, gossip).
// PeerAgent creates one on TaskAssigned (it owns the trainer, the data and the snapshot store and
// hands them to the runner's factory) and destroys it when the task ends.
//
// Threading: Intercept() is called on the session reader thread and must not block; everything
// else runs on the agent's single worker thread, in event order.
class ModeRunner {
 public:
  virtual ~ModeRunner() = default;

  // Called once on the worker right after creation (e.g. send ModelHeld).
  virtual void Start() {}

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
  // (its keep_going turns false). Must not block.
  virtual bool Supersedes(const coordinator::v1::CoordinatorEvent& event) const { return false; }
};

}  // namespace shoal::peer
