#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/task_store.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// Aggregator work a mode asks for: the core runs it off the gRPC threads, on the task's own queue
// (one call at a time per task, in the order asked; checkpoints and restores, which move whole
// models, on a second queue of the task), and hands the result back to ModeTask::OnWorkDone.
struct AggregatorWork {
  enum class Kind {
    kOpenRound,   // `open` (task filled in by the core)
    kCloseRound,  // `close` -> WorkResult::closed
    // Pull model `version` from the aggregator and store it as the checkpoint of `round`.
    // Fire and forget: its result only reaches the mode when it failed.
    kCheckpoint,
    // Put the task's newest model at the aggregator -> WorkResult::restored: the newest version
    // published (`version`, of `round`, with `digest`), from its checkpoint or, where the
    // checkpoint is older or its file cannot be read, from an aggregator that still holds it
    // (`holders`: the checkpoint is made there first); else the newest checkpoint, under a
    // version number after every one used (`last_used`, or the newest version the aggregator
    // held, if higher: one made there whose round was never stored). NOT_FOUND when the task
    // has neither (the mode then initializes a model from a peer, numbered after
    // WorkResult::last_used).
    kRestore,
    // `buffer` (task filled in by the core). On a tree every node's buffer opens, from the root
    // down, each sized by `peers` below it.
    kOpenBuffer,
    // A tree's nodes below the root fetch model `version` from their parents, from the top down
    // (a node that cannot is logged, not an error).
    kPullTree,
  };
  Kind kind = Kind::kOpenRound;
  uint64_t id = 0;  // set by the core
  aggregator::v1::OpenRoundRequest open;
  aggregator::v1::CloseRoundRequest close;
  aggregator::v1::OpenBufferRequest buffer;
  uint64_t version = 0;                 // kCheckpoint, kPullTree, kRestore
  uint64_t round = 0;                   // kCheckpoint, kRestore
  uint64_t digest = 0;                  // kRestore: of `version` (0: not known)
  uint64_t last_used = 0;               // kRestore: the highest version number the task used
  std::vector<std::string> peers = {};  // kOpenBuffer: the task's peers
  // kRestore (filled in by the core): the aggregators that may hold `version`, the task's root
  // first.
  std::vector<std::string> holders = {};
};

struct WorkResult {
  AggregatorWork work;  // what was asked (kind, id, request)
  absl::Status status;
  aggregator::v1::CloseRoundResponse closed;  // kCloseRound
  StoredCheckpoint restored;                  // kRestore
  // kRestore: the highest version number the task used as far as the restore learned
  // (work.last_used, or the newest version the aggregator held, if higher).
  uint64_t last_used = 0;
  // kOpenRound on a tree with secure aggregation: each cluster's peers, one secure round each
  // (work.open then lists only the peers expected: those of a cluster too small sit it out).
  std::vector<std::vector<std::string>> secure_groups;
};

// What a mode's state machine asks CoordinatorCore to do after one input. The core applies it
// under its lock and delivers events, store writes and aggregator work after releasing it.
struct ModeEffects {
  // Events for peers, in order: {peer id, event}. The core sets each event's task.
  std::vector<std::pair<std::string, v1::CoordinatorEvent>> events;
  // Rounds that completed; the core appends them to the history and persists them.
  std::vector<v1::RoundSummary> rounds_completed;
  // Aggregator work (only for modes that use an aggregator); ids are assigned by the core.
  std::vector<AggregatorWork> work;
  // The rounds after this one are to run again (a restore went back to an older checkpoint):
  // the core forgets their stored summaries.
  std::optional<uint64_t> rounds_rerun_after;
  // The status changed: watchers are notified and the task is persisted.
  bool changed = false;
  // End the task (completed, failed): the core sends TaskFinished and releases its peers.
  std::optional<std::pair<v1::TaskState, std::string>> finish;

  void Send(const std::string& peer_id, v1::CoordinatorEvent event) {
    events.emplace_back(peer_id, std::move(event));
  }
  void Ask(AggregatorWork w) { work.push_back(std::move(w)); }
  void Finish(v1::TaskState state, std::string message) {
    finish.emplace(state, std::move(message));
  }
};

// A peer as a mode sees it.
struct ModePeer {
  std::string id;
  std::string address;  // HOST:PORT of its PeerService
  // Hello.identity_public_key: signs its secure-aggregation keys (empty: none).
  std::string identity_public_key = "";
};

// Settings every mode may use (from CoordinatorOptions).
struct ModeOptions {
  absl::Duration final_eval_timeout = absl::Seconds(60);
  absl::Duration retry_initial = absl::Milliseconds(250);
  absl::Duration retry_max = absl::Seconds(5);
  int max_failures = 20;  // consecutive failed aggregator calls (not counting lost aggregators)
};

// The state machine of one task in one mode (services/coordinator/modes/<mode>/). Plain C++ driven
// by CoordinatorCore under its lock, one call per input, with the time of the input: no threads,
// no I/O, no clock of its own (unit tests drive it event by event). Every call receives the
// task's status to read and update (state, phase, round, model version, message). Messages,
// membership and timers come from the core; aggregator work goes out through ModeEffects and its
// results come back through OnWorkDone.
class ModeTask {
 public:
  virtual ~ModeTask() = default;

  // The peer was assigned to the task (the core has sent it TaskAssigned).
  virtual void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
                       ModeEffects& fx) = 0;
  // The peer left the task: graceful Leave, crash (stream lost, missed heartbeats) or PeerError.
  virtual void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                          v1::TaskStatus& status, ModeEffects& fx) = 0;
  // A message from a member of the task that the core does not handle itself (all but Hello,
  // Heartbeat, Leave and PeerError); EvalReports are passed too, after the core credited them to
  // the history. Errors: FAILED_PRECONDITION a stale or unexpected message, INVALID_ARGUMENT a
  // malformed one; the core counts them and answers nothing else.
  virtual absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message,
                                 absl::Time now, v1::TaskStatus& status, ModeEffects& fx) = 0;
  // Timers (deadlines). Called whenever the core reconciles, at least every heartbeat interval.
  virtual void Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) = 0;

  // --- Modes that use an aggregator ---
  // The task has an aggregator at `address`: the first one, or a replacement for one that was
  // lost (then the core has re-sent TaskAssigned to the peers, and the results of work asked
  // before are dropped). The new aggregator holds nothing of the task yet.
  virtual void OnAggregator(const std::string& address, absl::Time now, v1::TaskStatus& status,
                            ModeEffects& fx) {}
  // The task's aggregator is gone and none other is registered: nothing runs until the next
  // OnAggregator (work asked meanwhile is dropped).
  virtual void OnAggregatorLost(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {}
  // An event of the aggregator's watch stream (WatchStarted, PushAccepted).
  virtual void OnAggregatorEvent(const aggregator::v1::TaskEvent& event, absl::Time now,
                                 v1::TaskStatus& status, ModeEffects& fx) {}
  // The result of work asked through ModeEffects::Ask.
  virtual void OnWorkDone(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                          ModeEffects& fx) {}
};

// Makes the ModeTask of one task of one mode. `status` may come from the task store after a
// coordinator restart (round, model version and history kept).
using ModeTaskFactory = std::unique_ptr<ModeTask> (*)(const v1::TaskStatus& status,
                                                      const ModeOptions& options,
                                                      CoordinatorMetrics& metrics);

// A mode this coordinator runs: its factory (defined in services/coordinator/modes/<mode>/).
struct CoordinatorMode {
  common::v1::Mode mode;
  ModeTaskFactory create;
};

// Every mode this coordinator runs, in the order of the Mode enum (the table in
// services/coordinator/mode_registry.cc, one line per mode).
absl::Span<const CoordinatorMode> RegisteredModes();

// Creates the ModeTask of `status.spec().mode()`; nullptr for a mode this coordinator does not
// run.
std::unique_ptr<ModeTask> MakeModeTask(const v1::TaskStatus& status, const ModeOptions& options,
                                       CoordinatorMetrics& metrics);

}  // namespace shoal::coordinator
