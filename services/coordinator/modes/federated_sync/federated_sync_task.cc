#include "services/coordinator/modes/federated_sync/federated_sync_task.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/async_spec.h"
#include "libs/common/log.h"
#include "libs/task/task_privacy.h"
#include "services/coordinator/privacy_budget.h"

namespace shoal::coordinator {
using Kind = AggregatorWork::Kind;

namespace {
constexpr uint32_t kLateMaxStaleness = 10;
}  // namespace

FederatedSyncTask::FederatedSyncTask(const v1::TaskStatus& status, const ModeOptions& options,
                                     CoordinatorMetrics& metrics)
    : AggregatorModeTask(status, options, metrics),
      stragglers_(spec_.straggler_factor(), spec_.straggler_rounds()),
      budget_(task_, spec_, metrics) {
  // Late updates: staleness weighted (1 + s)^-1 as federated-async's default, and a bound wide
  // enough for a peer several times slower than the others (its update spans that many rounds).
  aggregation::ApplyAsyncDefaults(late_staleness_, 1);
  late_staleness_.set_max_staleness(kLateMaxStaleness);
}

void FederatedSyncTask::RemovePeer(const std::string& peer_id, const std::string& why,
                                   absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  // A peer whose update was accepted stays in the round's aggregate; one that had not pushed is
  // no longer waited for.
  round_.expected.erase(peer_id);
  busy_.erase(peer_id);
  late_times_.erase(peer_id);
  stragglers_.Remove(peer_id);
  ShowAsyncPeers(status);
  AggregatorModeTask::RemovePeer(peer_id, why, now, status, fx);
}

void FederatedSyncTask::Reset(v1::TaskStatus& status) {
  if (status.phase() == v1::ROUND_PHASE_EVALUATING) {
    // The last round is done: its model was published and is being evaluated; nothing to redo.
    pending_.reset();
    checkpoints_.Reset();
    return;
  }
  if (round_.number != 0 && status.phase() != v1::ROUND_PHASE_UNSPECIFIED) {
    LogWarning("task ", task_, ": round ", round_.number, " abandoned (aggregator changed)");
  }
  model_.Forget();
  pending_.reset();
  checkpoints_.Reset();
  round_ = Round{};
  // The new aggregator's TaskAssigned stops what the async peers were training.
  busy_.clear();
  late_times_.clear();
  status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
}

void FederatedSyncTask::OnAggregatorEvent(const aggregator::v1::TaskEvent& event, absl::Time now,
                                          v1::TaskStatus& status, ModeEffects& fx) {
  if (event.has_push_accepted()) {
    // An async peer is idle again once its late update is in, whichever round took it (the
    // event may come after that round closed here).
    if (auto it = busy_.find(event.push_accepted().peer_id()); it != busy_.end()) {
      late_times_[it->first] = now - it->second.started;
      busy_.erase(it);
    }
  }
  if (round_.number == 0) return;
  if (event.has_started() && event.started().open_round() == round_.number) {
    round_.accepted.insert(event.started().accepted().begin(), event.started().accepted().end());
  } else if (event.has_push_accepted() && event.push_accepted().round() == round_.number) {
    const aggregator::v1::PushAccepted& push = event.push_accepted();
    round_.accepted.insert(push.peer_id());
    metrics_.updates_accepted.Increment();
    if (round_.late_peers.count(push.peer_id()) == 0) {
      round_.accepted_pushes.emplace(
          push.peer_id(),
          Round::Accepted{now - round_.started, push.train_ms(), push.update_bytes()});
    }
  } else {
    return;
  }
  Advance(now, status, fx);
}

bool FederatedSyncTask::AllAccepted() const {
  // Asked on every accepted push: the walk of both sets (10,000 peers: most of the
  // coordinator's CPU) only once there can be enough.
  if (round_.accepted.size() < round_.expected.size()) return false;
  return std::includes(round_.accepted.begin(), round_.accepted.end(), round_.expected.begin(),
                       round_.expected.end());
}

bool FederatedSyncTask::FinalEvaluationDone(const v1::TaskStatus& status) {
  for (int i = status.history_size() - 1; i >= 0; --i) {
    const v1::RoundSummary& r = status.history(i);
    if (r.model_version() == status.model_version()) return r.evaluation_complete();
  }
  return false;  // its round is not in the history yet (the core appends it after this input)
}

void FederatedSyncTask::Ask(Kind kind, AggregatorWork work, ModeEffects& fx) {
  work.kind = kind;
  pending_ = kind;
  fx.Ask(std::move(work));
}

void FederatedSyncTask::Advance(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  if (budget_.enabled() && !status.has_privacy()) {
    budget_.Init(status);  // epsilon 0 shows from the start
    fx.changed = true;
  }
  if (!has_aggregator_ || pending_.has_value() || !retry_.Ready(now)) return;
  switch (status.phase()) {
    case v1::ROUND_PHASE_TRAINING: {
      // The last round also waits for the async peers still training (until its deadline):
      // no later round would take their updates.
      const bool all = AllAccepted() && (round_.number < spec_.rounds() || !AnyBusy(now));
      if (!all && now < round_.deadline) return;
      if (!all) LogWarning("task ", task_, ": round ", round_.number, " deadline passed");
      status.set_phase(v1::ROUND_PHASE_CLOSING);
      AggregatorWork close;
      close.close.set_round(round_.number);
      Ask(Kind::kCloseRound, std::move(close), fx);
      fx.changed = true;
      return;
    }
    case v1::ROUND_PHASE_EVALUATING:
      if (!FinalEvaluationDone(status) && now < eval_deadline_) return;
      // Before the last round only the privacy budget ends a task; its message says so.
      fx.Finish(v1::TASK_STATE_COMPLETED,
                status.round() < spec_.rounds()
                    ? status.message()
                    : absl::StrCat("completed ", spec_.rounds(), " rounds"));
      return;
    case v1::ROUND_PHASE_OPENING:
    case v1::ROUND_PHASE_CLOSING:
      return;  // a call is in flight (pending_ is checked above)
    default:
      break;
  }

  // Idle between rounds: get a model, then open the next round when enough peers are here.
  if (model_.Next(peers_, now, status, fx) != GlobalModel::Step::kHeld) return;
  if (status.phase() == v1::ROUND_PHASE_INITIALIZING) {
    status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    fx.changed = true;
  }
  if (status.round() >= spec_.rounds()) {
    // Resumed after the last round (the coordinator before this one stopped while the peers
    // evaluated its model): no round past the last; the evaluation ends the task.
    status.set_state(v1::TASK_STATE_RUNNING);
    EvaluateLast(now, status);
    fx.changed = true;
    Advance(now, status, fx);
    return;
  }
  if (peers_.size() < spec_.min_participants()) {
    waiting_.Update(peers_, spec_.min_participants(), now, status, fx);
    return;
  }
  waiting_.Clear();
  // Stop before a round that would spend more than the budget (every peer is expected: the
  // async peers of stragglers are refused with DP).
  const RoundBudget::Decision budget =
      budget_.Check(status, std::vector<std::string>(peers_.begin(), peers_.end()), peers_.size(),
                    status.round() + 1);
  switch (budget.kind) {
    case RoundBudget::Decision::Kind::kOpen:
      opening_charge_ = budget.charge;
      break;
    case RoundBudget::Decision::Kind::kWaitForData:
      return;
    case RoundBudget::Decision::Kind::kFailed:
      fx.Finish(v1::TASK_STATE_FAILED, budget.message);
      return;
    case RoundBudget::Decision::Kind::kSpent:
      // The task completes once the last published model is evaluated, as after its last round.
      status.set_phase(v1::ROUND_PHASE_EVALUATING);
      status.set_message(budget.message);
      eval_deadline_ = now + std::min(options_.final_eval_timeout,
                                      absl::Seconds(spec_.round_deadline_seconds()));
      fx.changed = true;
      Advance(now, status, fx);  // finishes at once when that evaluation is complete
      return;
  }
  AggregatorWork open;
  open.open.set_round(status.round() + 1);
  open.open.set_base_version(status.model_version());
  const bool secure = task::HasSecureAggregation(spec_);
  for (const std::string& id : peers_) {
    if (secure && identity_keys_.count(id) == 0) {
      // A peer too old to sign secure-aggregation keys cannot take part.
      LogWarning("task ", task_, ": peer '", id,
                 "' sent no identity key; it cannot take part in secure aggregation");
      continue;
    }
    if (stragglers_.IsAsync(id)) {
      open.open.add_late_peers(id);
    } else {
      open.open.add_expected_peers(id);
    }
  }
  if (open.open.late_peers_size() > 0) *open.open.mutable_late_staleness() = late_staleness_;
  open.open.set_max_update_norm(spec_.max_update_norm());
  open.open.mutable_aggregation()->set_strategy(spec_.aggregation());
  *open.open.mutable_aggregation()->mutable_options() = spec_.aggregation_options();
  // The aggregator clips and adds noise at level peer only; at level sample the peers' DP-SGD
  // steps did it.
  if (task::HasPeerDp(spec_)) *open.open.mutable_dp() = spec_.privacy().dp();
  if (secure) {
    const common::v1::SecureAggregationSpec& sa = spec_.privacy().secure_aggregation();
    aggregator::v1::SecureAggregationSettings& settings = *open.open.mutable_secure_aggregation();
    settings.set_enabled(true);
    settings.set_clip_norm(task::SecureClipNorm(spec_));
    settings.set_threshold(sa.threshold());
    settings.set_neighbourhood_size(sa.neighbourhood_size());
    for (const std::string& id : open.open.expected_peers()) {
      (*settings.mutable_identity_keys())[id] = identity_keys_.at(id);
    }
  }
  status.set_phase(v1::ROUND_PHASE_OPENING);
  Ask(Kind::kOpenRound, std::move(open), fx);
  fx.changed = true;
}

void FederatedSyncTask::OnWorkDone(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                                   ModeEffects& fx) {
  const Kind kind = result.work.kind;
  if (kind == Kind::kCheckpoint) {  // the core logged and counted a failure
    checkpoints_.Done(fx);
    return;
  }
  if (kind == Kind::kRestore) {
    fx.changed = true;
    if (absl::Status s = model_.OnRestored(result, status, fx); !s.ok()) {
      retry_.Failed("restore checkpoint", s, now, status, fx);
    } else {
      retry_.Succeeded();
    }
    Advance(now, status, fx);
    return;
  }
  if (!pending_.has_value() || *pending_ != kind) return;  // not the call we wait for
  pending_.reset();
  if (kind == Kind::kOpenRound) {
    OnOpened(result, now, status, fx);
  } else {
    OnClosed(result, now, status, fx);
  }
  Advance(now, status, fx);
}

void FederatedSyncTask::OnOpened(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                                 ModeEffects& fx) {
  fx.changed = true;
  if (!result.status.ok()) {
    status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    if (absl::IsNotFound(result.status) || absl::IsFailedPrecondition(result.status)) {
      // The aggregator lost the task or holds another version (it restarted): restore.
      model_.Forget();
    } else if (absl::IsResourceExhausted(result.status)) {
      // The aggregator cannot hold this task's round (e.g. its --max-buffer-bytes): retrying
      // cannot help, and the message names the numbers.
      fx.Finish(v1::TASK_STATE_FAILED,
                absl::StrCat("open round refused: ", result.status.message()));
      return;
    }
    retry_.Failed("open round", result.status, now, status, fx);
    return;
  }
  retry_.Succeeded();
  const aggregator::v1::OpenRoundRequest& open = result.work.open;
  if (budget_.enabled()) {
    // Charged now, before the round can publish anything; persisted with this input's status.
    RoundCharge charge = opening_charge_;
    if (!task::HasSampleDp(spec_)) {
      charge.q = RoundSamplingRate(static_cast<size_t>(open.expected_peers_size()),
                                   peers_.size() + open.late_peers_size());
    }
    if (absl::Status s = budget_.Charge(open.round(), charge, status); !s.ok()) {
      fx.Finish(v1::TASK_STATE_FAILED, std::string(s.message()));
      return;
    }
  }
  round_ = Round{};
  round_.number = open.round();
  round_.opened_with = static_cast<uint32_t>(open.expected_peers_size());
  round_.started = now;
  round_.deadline = now + absl::Seconds(spec_.round_deadline_seconds());
  for (const std::string& id : open.expected_peers()) {
    if (peers_.count(id)) round_.expected.insert(id);
  }
  round_.late_peers.insert(open.late_peers().begin(), open.late_peers().end());
  // Secure aggregation: each peer gets the identity keys of its secure round's participants, the
  // round's expected peers or, on a tree, its cluster's.
  const auto& keys = open.secure_aggregation().identity_keys();
  if (result.secure_groups.empty() && !keys.empty()) {
    for (const std::string& id : round_.expected) {
      round_.identity_keys[id] = std::map<std::string, std::string>(keys.begin(), keys.end());
    }
  }
  for (const std::vector<std::string>& group : result.secure_groups) {
    std::map<std::string, std::string> group_keys;
    for (const std::string& id : group) group_keys[id] = keys.at(id);
    for (const std::string& id : group) round_.identity_keys[id] = group_keys;
  }
  status.set_round(open.round());
  status.set_phase(v1::ROUND_PHASE_TRAINING);
  status.set_state(v1::TASK_STATE_RUNNING);
  status.set_message(
      absl::StrCat("round ", open.round(), " training with ", round_.expected.size(), " peers"));
  const v1::CoordinatorEvent event = RoundStartedEvent(status, round_.deadline);
  for (const std::string& id : round_.expected) {
    v1::CoordinatorEvent own = event;
    if (auto it = round_.identity_keys.find(id); it != round_.identity_keys.end()) {
      own.mutable_round_started()->mutable_identity_keys()->insert(it->second.begin(),
                                                                   it->second.end());
    }
    fx.Send(id, std::move(own));
  }
  StartIdleAsyncPeers(now, status, fx);
}

v1::CoordinatorEvent FederatedSyncTask::RoundStartedEvent(const v1::TaskStatus& status,
                                                          absl::Time deadline) const {
  v1::CoordinatorEvent event;
  auto* started = event.mutable_round_started();
  started->set_round(round_.number);
  started->set_model_version(status.model_version());
  started->set_round_batches(spec_.round_batches());
  started->set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  started->set_expected_peers(round_.opened_with);
  return event;
}

void FederatedSyncTask::StartIdleAsyncPeers(absl::Time now, v1::TaskStatus& status,
                                            ModeEffects& fx) {
  // Its update is taken while at most max_staleness versions old: that many rounds, and this one.
  const absl::Time deadline = now + absl::Seconds(spec_.round_deadline_seconds()) *
                                        static_cast<int64_t>(late_staleness_.max_staleness() + 1);
  const v1::CoordinatorEvent event = RoundStartedEvent(status, deadline);
  for (const std::string& id : stragglers_.async_peers()) {
    if (peers_.count(id) == 0 || Busy(id, now)) continue;
    busy_[id] = Training{now, deadline};
    fx.Send(id, event);
  }
}

bool FederatedSyncTask::AnyBusy(absl::Time now) const {
  // (RemovePeer takes a leaving peer out of busy_.)
  return std::any_of(busy_.begin(), busy_.end(),
                     [now](const auto& entry) { return now < entry.second.deadline; });
}

bool FederatedSyncTask::Busy(const std::string& peer, absl::Time now) const {
  auto it = busy_.find(peer);
  return it != busy_.end() && now < it->second.deadline;
}

void FederatedSyncTask::JudgePace(v1::TaskStatus& status) {
  if (!stragglers_.enabled()) return;
  std::map<std::string, std::optional<absl::Duration>> sync_times;
  for (const std::string& id : round_.expected) {
    if (auto it = round_.accepted_pushes.find(id); it != round_.accepted_pushes.end()) {
      sync_times[id] = it->second.after;
    } else if (round_.accepted.count(id) == 0) {
      sync_times[id] = std::nullopt;  // missed the round
    }  // else accepted before this coordinator watched: no time to judge
  }
  for (const StragglerTracker::Move& move : stragglers_.OnRoundClosed(sync_times, late_times_)) {
    LogInfo("task ", task_, ": peer ", move.peer,
            move.to_async ? " moves to asynchronous contribution: " : " holds the rounds again: ",
            move.why);
    metrics_.federated_sync.straggler_moves
        .Add({{"direction", move.to_async ? "to_async" : "to_sync"}})
        .Increment();
    if (!move.to_async) busy_.erase(move.peer);
  }
  late_times_.clear();
  ShowAsyncPeers(status);
}

void FederatedSyncTask::ShowAsyncPeers(v1::TaskStatus& status) const {
  status.clear_async_peers();
  for (const std::string& id : stragglers_.async_peers()) status.add_async_peers(id);
}

void FederatedSyncTask::OnClosed(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                                 ModeEffects& fx) {
  fx.changed = true;
  if (!result.status.ok() && task::HasSecureAggregation(spec_) &&
      absl::IsFailedPrecondition(result.status)) {
    // Too many peers dropped out of the secure aggregation: nothing was published; the round
    // runs again (opened again with the same number, every peer retrains).
    LogWarning("task ", task_, ": round ", round_.number, " runs again: ", result.status.message());
    status.set_round(round_.number - 1);
    status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    status.set_message(
        absl::StrCat("round ", round_.number, " runs again: ", result.status.message()));
    round_ = Round{};
    return;
  }
  if (!result.status.ok()) {
    status.set_phase(v1::ROUND_PHASE_TRAINING);  // Advance() retries the close
    retry_.Failed("close round", result.status, now, status, fx);
    return;
  }
  retry_.Succeeded();
  const aggregator::v1::CloseRoundResponse& closed = result.closed;
  v1::RoundSummary summary;
  summary.set_round(round_.number);
  const std::set<std::string> contributors(closed.contributors().begin(),
                                           closed.contributors().end());
  for (const std::string& id : contributors) summary.add_participants(id);
  for (const std::string& id : round_.expected) {
    if (!contributors.count(id)) summary.add_dropped(id);
  }
  uint64_t update_bytes = 0;
  for (const auto& [id, push] : round_.accepted_pushes) {
    if (!contributors.count(id)) continue;
    v1::PeerRoundTime* time = summary.add_peer_times();
    time->set_peer_id(id);
    time->set_ms(absl::ToInt64Milliseconds(push.after));
    time->set_train_ms(push.train_ms);
    time->set_update_bytes(push.bytes);
    update_bytes += push.bytes;
  }
  summary.set_update_bytes(update_bytes);
  for (const std::string& id : round_.late_peers) {
    if (contributors.count(id)) summary.add_late(id);
  }
  summary.set_model_bytes(closed.model_bytes());
  summary.set_mean_train_loss(closed.mean_train_loss());
  summary.set_num_samples(closed.num_samples());
  summary.set_model_version(closed.version());
  summary.set_model_digest(closed.digest_xxh3());
  summary.set_duration_ms(absl::ToInt64Milliseconds(now - round_.started));
  if (status.has_privacy()) summary.set_epsilon(status.privacy().epsilon());
  // Published to nobody: there is no evaluation to wait for.
  if (peers_.empty()) summary.set_evaluation_complete(true);
  LogInfo("task ", task_, ": round ", round_.number, " closed: ", contributors.size(),
          " contributors (", summary.late_size(), " late), ", summary.dropped_size(),
          " dropped, loss ", closed.mean_train_loss(), ", model version ", closed.version());
  fx.rounds_completed.push_back(summary);
  JudgePace(status);
  if (closed.version() != status.model_version()) {
    checkpoints_.Published(closed.version(), round_.number, fx);
  }
  status.set_model_version(closed.version());
  v1::CoordinatorEvent event;
  event.mutable_model_published()->set_round(round_.number);
  event.mutable_model_published()->set_version(closed.version());
  const uint64_t number = round_.number;
  const bool last = number >= spec_.rounds();
  for (const std::string& id : peers_) {
    // An async peer still training would stop for it; after the last round it is the end.
    if (Busy(id, now) && !last) continue;
    fx.Send(id, event);
  }
  round_ = Round{};
  if (last) {
    EvaluateLast(now, status);
  } else {
    status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
  }
}

void FederatedSyncTask::EvaluateLast(absl::Time now, v1::TaskStatus& status) {
  status.set_phase(v1::ROUND_PHASE_EVALUATING);
  eval_deadline_ =
      now + std::min(options_.final_eval_timeout, absl::Seconds(spec_.round_deadline_seconds()));
  status.set_message("evaluating the final model");
}

std::unique_ptr<ModeTask> MakeFederatedSyncTask(const v1::TaskStatus& status,
                                                const ModeOptions& options,
                                                CoordinatorMetrics& metrics) {
  return std::make_unique<FederatedSyncTask>(status, options, metrics);
}

}  // namespace shoal::coordinator
