#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/coordinator/coordinator_metrics.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// What a mode's state machine asks CoordinatorCore to do after one input. The core applies it
// under its lock and delivers the events after releasing it.
struct ModeEffects {
  // Events for peers, in order: {peer id, event}.
  std::vector<std::pair<std::string, v1::CoordinatorEvent>> events;
  // Rounds that completed; the core appends them to the history and persists them.
  std::vector<v1::RoundSummary> rounds_completed;
  // The status changed: watchers are notified and the task is persisted.
  bool changed = false;
  // End the task (completed, failed): the core sends TaskFinished and releases its peers.
  std::optional<std::pair<v1::TaskState, std::string>> finish;

  void Send(const std::string& peer_id, v1::CoordinatorEvent event) {
    events.emplace_back(peer_id, std::move(event));
  }
};

// A peer as a mode sees it.
struct ModePeer {
  std::string id;
  std::string address;  // HOST:PORT of its PeerService
};

// The state machine of a task whose mode needs no aggregator (decentralized, gossip). Plain C++
// driven by CoordinatorCore under its lock, one call per input, with the time of the input: no
// threads, no I/O, no clock of its own (unit tests drive it event by event). Every call receives
// the task's status to read and update (state, phase, round, peers, message).
class ModeTask {
 public:
  virtual ~ModeTask() = default;

  // The peer was assigned to the task (the core has sent it TaskAssigned).
  virtual void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
                       ModeEffects& fx) = 0;
  // The peer left the task: graceful Leave, crash (stream lost, missed heartbeats) or PeerError.
  virtual void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                          v1::TaskStatus& status, ModeEffects& fx) = 0;
  // A message of this mode from a member of the task; EvalReports are passed too (after the core
  // credited them to the history). Errors: FAILED_PRECONDITION a stale or unexpected message,
  // INVALID_ARGUMENT a malformed one; the core counts them and answers nothing else.
  virtual absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message,
                                 absl::Time now, v1::TaskStatus& status, ModeEffects& fx) = 0;
  // Timers (deadlines). Called whenever the core reconciles, at least every heartbeat interval.
  virtual void Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) = 0;
};

// The ModeTask for `status.spec().mode()` (decentralized or gossip); nullptr for federated-sync.
// `status` may come from the task store after a coordinator restart (round, history kept).
std::unique_ptr<ModeTask> MakeModeTask(const v1::TaskStatus& status, CoordinatorMetrics& metrics);

}  // namespace shoal::coordinator
