#include "services/coordinator/global_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"

namespace shoal::coordinator {

void GlobalModel::Forget() {
  state_ = State::kUnknown;
  initializer_.clear();
}

GlobalModel::Step GlobalModel::Next(const std::set<std::string>& peers, absl::Time now,
                                    v1::TaskStatus& status, ModeEffects& fx) {
  switch (state_) {
    case State::kHeld:
      return Step::kHeld;
    case State::kRestoring:
      return Step::kRestoring;
    case State::kUnknown: {
      state_ = State::kRestoring;
      status.set_phase(v1::ROUND_PHASE_INITIALIZING);
      status.set_message("restoring the newest checkpoint");
      AggregatorWork restore;
      restore.kind = AggregatorWork::Kind::kRestore;
      // The newest version published (its round was stored before any peer learned of it):
      // the one to restore, if some place still holds it.
      if (!status.history().empty()) {
        const v1::RoundSummary& last = *status.history().rbegin();
        restore.version = last.model_version();
        restore.round = last.round();
        restore.digest = last.model_digest();
      }
      // Versions without a round (an initial model, a checkpoint under a new number) count too.
      restore.last_used = std::max(restore.version, status.model_version());
      last_used_ = restore.last_used;
      fx.Ask(std::move(restore));
      fx.changed = true;
      return Step::kRestoring;
    }
    case State::kInitializing:
      // A peer is uploading the initial model; give up on it if it left or is too slow.
      if (peers.count(initializer_) > 0 && now < init_deadline_) return Step::kInitializing;
      LogWarning("task ", task_, ": initializer ", initializer_, " did not finish");
      state_ = State::kNone;
      initializer_.clear();
      [[fallthrough]];
    case State::kNone:
      break;
  }
  status.set_phase(v1::ROUND_PHASE_INITIALIZING);
  if (peers.empty()) {
    status.set_message("waiting for a peer to upload the initial model");
    return Step::kInitializing;
  }
  initializer_ = *peers.begin();
  state_ = State::kInitializing;
  init_deadline_ = now + init_timeout_;
  status.set_message(absl::StrCat("peer ", initializer_, " stores the initial model"));
  v1::CoordinatorEvent event;
  event.mutable_initialize_model()->set_version(initial_version_);
  fx.Send(initializer_, std::move(event));
  fx.changed = true;
  return Step::kInitializing;
}

absl::Status GlobalModel::OnRestored(const WorkResult& result, v1::TaskStatus& status,
                                     ModeEffects& fx) {
  if (state_ != State::kRestoring) return absl::OkStatus();  // forgotten meanwhile
  if (absl::IsNotFound(result.status)) {
    // No checkpoint: start over from the initial model (the peers rebuild it from the seed),
    // under a number after every one the task used, if it used any (the aggregator may have
    // held a version no round of the task names).
    state_ = State::kNone;
    last_used_ = std::max(last_used_, result.last_used);
    initial_version_ = last_used_ > 0 ? last_used_ + 1 : 0;
    status.set_model_version(initial_version_);
    status.set_round(0);
    status.clear_history();
    fx.rounds_rerun_after = 0;
    return absl::OkStatus();
  }
  if (!result.status.ok()) {
    state_ = State::kUnknown;  // asked again after the mode's backoff
    return result.status;
  }
  state_ = State::kHeld;
  const StoredCheckpoint& c = result.restored;
  // Rounds after the checkpoint produced models that are lost (with the aggregator that held
  // them): they run again, and their versions are not used again (the checkpoint came back
  // under a new number).
  auto* history = status.mutable_history();
  while (!history->empty() && history->rbegin()->round() > c.round) history->RemoveLast();
  fx.rounds_rerun_after = c.round;
  status.set_model_version(c.version);
  status.set_round(c.round);
  status.set_message(absl::StrCat("restored model version ", c.version, " (round ", c.round, ")"));
  LogInfo("task ", task_, ": ", status.message());
  return absl::OkStatus();
}

absl::Status GlobalModel::OnInitialized(const std::string& peer_id, v1::TaskStatus& status) {
  if (state_ != State::kInitializing || peer_id != initializer_) {
    return absl::FailedPreconditionError("unexpected model_initialized");
  }
  state_ = State::kHeld;
  initializer_.clear();
  status.set_model_version(initial_version_);
  LogInfo("task ", task_, ": initial model stored by ", peer_id, " as version ", initial_version_);
  return absl::OkStatus();
}

void Checkpoints::Published(uint64_t version, uint64_t round, ModeEffects& fx) {
  if (in_flight_) {
    waiting_.emplace(version, round);
    return;
  }
  Ask(version, round, fx);
}

void Checkpoints::Done(ModeEffects& fx) {
  in_flight_ = false;
  if (!waiting_.has_value()) return;
  const auto [version, round] = *waiting_;
  waiting_.reset();
  Ask(version, round, fx);
}

void Checkpoints::Reset() {
  in_flight_ = false;
  waiting_.reset();
}

void Checkpoints::Ask(uint64_t version, uint64_t round, ModeEffects& fx) {
  in_flight_ = true;
  AggregatorWork work;
  work.kind = AggregatorWork::Kind::kCheckpoint;
  work.version = version;
  work.round = round;
  fx.Ask(std::move(work));
}

void CallRetry::Failed(const std::string& step, const absl::Status& error, absl::Time now,
                       v1::TaskStatus& status, ModeEffects& fx) {
  metrics_.aggregator_errors.Increment();
  const bool transport =
      absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error) || absl::IsCancelled(error);
  if (!transport) ++failures_;
  const int exponent = std::min(failures_ + 1, 10);
  retry_at_ = now + std::min(options_.retry_max, options_.retry_initial * (1 << exponent));
  status.set_message(absl::StrCat(step, " failed: ", error.message(), " (retrying)"));
  LogWarning("task ", task_, ": ", status.message());
  fx.changed = true;
  if (failures_ >= options_.max_failures) {
    fx.Finish(v1::TASK_STATE_FAILED,
              absl::StrCat(step, " failed ", failures_, " times: ", error.message()));
  }
}

}  // namespace shoal::coordinator
