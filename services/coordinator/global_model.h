#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/coordinator/mode_task.h"

namespace shoal::coordinator {

// What the aggregator of an aggregator-backed task (federated-sync, federated-async) holds of the
// task's global model, and how it comes to hold one: the newest checkpoint is restored there
// (AggregatorWork kRestore); without a checkpoint a peer uploads the initial model built from the
// task's seed (InitializeModel -> ModelInitialized). A part of the mode's state machine: the mode
// calls it while the model is not held and forwards the restore result and ModelInitialized.
// Not thread-safe: driven under the core's lock.
class GlobalModel {
 public:
  // `init_timeout`: how long a peer may take to upload the initial model.
  GlobalModel(std::string task, absl::Duration init_timeout)
      : task_(std::move(task)), init_timeout_(init_timeout) {}

  // The aggregator holds nothing we know of (a new aggregator, or it lost the task): the next
  // step restores the newest checkpoint.
  void Forget();
  bool held() const { return state_ == State::kHeld; }

  enum class Step {
    kHeld,         // the aggregator holds status.model_version: go on
    kRestoring,    // a kRestore was asked (in fx): wait for its result
    kInitializing  // waiting for a peer's upload (or for a peer to ask)
  };
  // Takes the next step towards a held model. Sets the status' phase (INITIALIZING) and message
  // while the model is not held.
  Step Next(const std::set<std::string>& peers, absl::Time now, v1::TaskStatus& status,
            ModeEffects& fx);
  // The result of the kRestore asked by Next(). OK: held (status' version, round and history
  // set back to the checkpoint's); NOT_FOUND: there is no checkpoint (a peer will upload the
  // initial model; status starts from version 0); any other error is returned for the mode to
  // retry with backoff.
  absl::Status OnRestored(const WorkResult& result, v1::TaskStatus& status, ModeEffects& fx);
  // ModelInitialized from `peer_id`. FAILED_PRECONDITION when no upload was asked of it.
  absl::Status OnInitialized(const std::string& peer_id, v1::TaskStatus& status);

 private:
  enum class State {
    kUnknown,       // restore the newest checkpoint first
    kRestoring,     // kRestore asked
    kNone,          // no checkpoint: a peer uploads the initial model
    kInitializing,  // InitializeModel sent to initializer_
    kHeld,
  };

  const std::string task_;
  const absl::Duration init_timeout_;
  State state_ = State::kUnknown;
  std::string initializer_;
  absl::Time init_deadline_;
  // The highest version number the task used when the restore was asked, and the number its
  // initial model is stored under (0, unless the task lost every version it had).
  uint64_t last_used_ = 0;
  uint64_t initial_version_ = 0;
};

// The checkpoints of an aggregator-backed task, one at a time: a version published while the
// checkpoint of an earlier one is still being written waits, and only the newest waiting version
// is written next (restoring needs the newest checkpoint, not every one). Not thread-safe.
class Checkpoints {
 public:
  // `version` (published by `round`) should be checkpointed.
  void Published(uint64_t version, uint64_t round, ModeEffects& fx);
  // The kCheckpoint asked last has finished (written or failed).
  void Done(ModeEffects& fx);
  // The aggregator changed: the checkpoint in flight will not report back.
  void Reset();

 private:
  void Ask(uint64_t version, uint64_t round, ModeEffects& fx);

  bool in_flight_ = false;
  std::optional<std::pair<uint64_t, uint64_t>> waiting_;  // {version, round}
};

// Backoff of an aggregator-backed mode's failed calls. Transport errors (unreachable, late,
// cancelled) are retried without limit: the core judges whether the aggregator is alive (its
// watch stream) and moves the task when it is not. Other errors fail the task after
// ModeOptions::max_failures in a row. Not thread-safe.
class CallRetry {
 public:
  CallRetry(std::string task, const ModeOptions& options, CoordinatorMetrics& metrics)
      : task_(std::move(task)), options_(options), metrics_(metrics) {}

  // Whether the next call may go out now.
  bool Ready(absl::Time now) const { return now >= retry_at_; }
  void Succeeded() { failures_ = 0; }
  // `step` failed with `error`: backs off, reports it in the status, and asks the core to fail
  // the task once the limit is reached.
  void Failed(const std::string& step, const absl::Status& error, absl::Time now,
              v1::TaskStatus& status, ModeEffects& fx);
  void Reset() { retry_at_ = absl::InfinitePast(); }

 private:
  const std::string task_;
  const ModeOptions options_;
  CoordinatorMetrics& metrics_;
  int failures_ = 0;
  absl::Time retry_at_ = absl::InfinitePast();
};

}  // namespace shoal::coordinator
