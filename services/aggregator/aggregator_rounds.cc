// AggregatorCore's rounds (federated-sync): OpenRound, CloseRound and the round side of the push
// pipeline. The core's state and locking are described in aggregator_core.h.

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/async_spec.h"
#include "libs/common/escape.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_core_internal.h"
#include "services/aggregator/memory_budget.h"
#include "services/aggregator/round_privacy.h"

namespace shoal::aggregator {

const char* RoundStateName(const AggregatorCore::Round& round) {
  switch (round.state) {
    case AggregatorCore::Round::State::kOpen:
      return "open";
    case AggregatorCore::Round::State::kClosing:
      return "closing";
    case AggregatorCore::Round::State::kClosed:
      return "closed";
    case AggregatorCore::Round::State::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

std::string RoundLabel(uint64_t round, const std::string& task) {
  return absl::StrCat("round ", round, " of ", TaskLabel(task));
}

namespace {

// A round opened again without standby_for is promoted: it keeps its primary's id (copies
// still in flight from it are counted once) and takes the peers' own pushes from then on.
void SetReplicas(AggregatorCore::Round& round, const OpenRoundParams& p) {
  round.backups = p.backups;
  round.replica_id = p.replica_id.empty() ? p.parent.child() : p.replica_id;
  round.standby = !p.standby_for.empty();
  if (round.standby) round.primary = p.standby_for;
}

}  // namespace

absl::Status AggregatorCore::OpenRound(const OpenRoundParams& p) {
  if (p.round == 0) return absl::InvalidArgumentError("round must be >= 1");
  if (!(p.max_update_norm >= 0) || !std::isfinite(p.max_update_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_update_norm must be finite and >= 0, got ", p.max_update_norm));
  }
  absl::StatusOr<aggregation::Strategy> strategy =
      StrategyFor(p.aggregation, options_.fold_threads);
  if (!strategy.ok()) return strategy.status();
  const std::set<std::string> expected(p.expected_peers.begin(), p.expected_peers.end());
  const std::set<std::string> late(p.late_peers.begin(), p.late_peers.end());
  const std::string label = RoundLabel(p.round, p.task);
  for (const std::string& id : late) {
    if (expected.count(id) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer '", EscapeBytes(id), "' is both expected and late in ", label));
    }
  }
  const std::set<std::string> children(p.expected_children.begin(), p.expected_children.end());
  for (const std::string& id : children) {
    if (expected.count(id) > 0 || late.count(id) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", EscapeBytes(id), "' is both a peer and a child supernode in ", label));
    }
  }
  for (const auto& [child, backup] : p.child_backups) {
    if (children.count(child) == 0 || backup.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": child_backups names '", EscapeBytes(child), "' (backup '", EscapeBytes(backup),
          "'), which is not an expected child or has no backup id"));
    }
  }
  if (!p.standby_for.empty() && !p.backups.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": a backup's round (standby_for) has no backups of its own"));
  }
  const bool child_round = !p.parent.address().empty() || !p.parent.child().empty();
  if (child_round) {
    if (p.parent.address().empty() || p.parent.child().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": parent needs both an address and this child's id"));
    }
  }
  if (absl::Status dp = CheckRoundDp(p, label); !dp.ok()) return dp;
  common::v1::AsyncSpec late_staleness = p.late_staleness;
  if (!late.empty()) {
    if (absl::Status s = aggregation::ValidateAsyncSpec(late_staleness, 0, "late_staleness");
        !s.ok()) {
      return s;
    }
    aggregation::ApplyAsyncDefaults(late_staleness, 1);  // max_staleness 4 when unset
  }
  // Every expected and late peer may contribute one update.
  const size_t contributors = expected.size() + late.size();
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(p.task);
  if (task == nullptr || task->versions.empty()) {
    return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(p.task)));
  }
  if (task->buffer != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(p.task),
                     " aggregates in a federated-async buffer (OpenBuffer): it has no rounds"));
  }
  const uint64_t model_bytes = task->versions.at(task->latest).model->layout.total_bytes();
  std::shared_ptr<Round> cur = task->round;
  if (cur != nullptr && cur->number == p.round) {
    if (cur->state == Round::State::kOpen) {
      if (cur->base_version != p.base_version) {
        return absl::FailedPreconditionError(absl::StrCat(
            label, " is open with base version ", cur->base_version, ", not ", p.base_version));
      }
      if (!cur->aggregation->Fits(*strategy, cur->base->layout)) {
        return absl::FailedPreconditionError(absl::StrCat(label, " is open with aggregation ",
                                                          cur->strategy->name(), ", not ",
                                                          strategy->name()));
      }
      // Idempotent re-open; the latest expected set and bound win.
      if (absl::Status fits = CheckRoundMemory(*strategy, contributors, model_bytes,
                                               options_.max_buffer_bytes, label);
          !fits.ok()) {
        metrics_.max_buffer_refusals.Increment();
        return fits;
      }
      cur->expected = expected;
      cur->children = children;
      task->children.insert(children.begin(), children.end());
      for (const auto& [child, backup] : p.child_backups) task->child_backups[child].insert(backup);
      cur->parent = p.parent;
      SetReplicas(*cur, p);
      cur->late = late;
      cur->late_staleness = late_staleness;
      cur->max_norm = p.max_update_norm;
      if (HasDp(p.dp) && !HasDp(cur->dp)) {
        return absl::FailedPreconditionError(
            absl::StrCat(label, " is open without differential privacy"));
      }
      return absl::OkStatus();
    }
    if (cur->state == Round::State::kClosed && cur->partial != nullptr && child_round &&
        cur->base_version == p.base_version) {
      // A child's round whose partial sum is made, opened again with another parent (the root's
      // backup took over): the sum goes there at the next CloseRound; nothing else changes.
      cur->parent = p.parent;
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(label, " is already ", RoundStateName(*cur)));
  }
  if (task->closed.count(p.round) > 0 || (cur != nullptr && p.round < cur->number)) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, " is older than the current round ", cur ? cur->number : 0));
  }
  if (cur != nullptr && cur->state == Round::State::kClosing) {
    return absl::AbortedError(
        absl::StrCat(RoundLabel(cur->number, p.task), " is still closing; retry"));
  }
  if (absl::Status base = CheckBaseIsLatest(*task, p.task, p.base_version); !base.ok()) {
    return base;
  }
  if (absl::Status fits =
          CheckRoundMemory(*strategy, contributors, model_bytes, options_.max_buffer_bytes, label);
      !fits.ok()) {
    metrics_.max_buffer_refusals.Increment();
    return fits;
  }
  auto round = std::make_shared<Round>();
  round->number = p.round;
  round->base_version = p.base_version;
  round->base = task->versions.at(p.base_version).model;
  round->expected = expected;
  round->children = children;
  task->children.insert(children.begin(), children.end());
  for (const auto& [child, backup] : p.child_backups) task->child_backups[child].insert(backup);
  round->parent = p.parent;
  SetReplicas(*round, p);
  round->late = late;
  round->late_staleness = late_staleness;
  round->max_norm = p.max_update_norm;
  round->dp = p.dp;
  round->dp_expected = expected.size();
  round->opened_at = clock_.Now();
  // Reuse the previous round's aggregation (mean: its sum buffer; the others: their update
  // copies) when nothing can touch it any more and it fits.
  if (cur != nullptr && cur->state == Round::State::kClosed && cur->folds_in_flight == 0 &&
      cur->aggregation != nullptr && cur->aggregation->Fits(*strategy, round->base->layout)) {
    round->aggregation = std::move(cur->aggregation);
    round->aggregation->Reset();
  } else {
    round->aggregation = std::make_unique<RoundAggregation>(*strategy, round->base->layout,
                                                            contributors, options_.fold_threads);
  }
  round->strategy = *std::move(strategy);
  AbandonRound(*task);
  task->round = std::move(round);
  return absl::OkStatus();
}

absl::StatusOr<RoundResult> AggregatorCore::CloseRound(const std::string& name, uint64_t number) {
  std::shared_ptr<Task> task;
  std::shared_ptr<Round> round;
  RoundResult result;
  std::vector<float> recycled;
  const std::string label = RoundLabel(number, name);
  {
    absl::MutexLock lock(&mu_);
    task = FindTask(name);
    if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
    if (auto it = task->closed.find(number); it != task->closed.end()) return it->second;
    round = task->round;
    if (round == nullptr || round->number != number || round->state == Round::State::kAbandoned) {
      return absl::NotFoundError(absl::StrCat(label, " is not open"));
    }
    if (round->state == Round::State::kClosing) {
      // Another CloseRound is applying this round; wait for its result.
      Round* r = round.get();
      mu_.Await(absl::Condition(
          +[](Round* r) { return r->state != Round::State::kClosing; }, r));
      if (auto it = task->closed.find(number); it != task->closed.end()) return it->second;
      return absl::AbortedError(absl::StrCat(label, " was abandoned while closing"));
    }
    if (round->partial != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " was closed as a partial sum for its parent"));
    }
    if (absl::Status folded = FinishFolds(*round, label); !folded.ok()) return folded;
    result.contributors.assign(round->accepted.begin(), round->accepted.end());
    result.num_samples = round->num_samples;
    result.mean_train_loss =
        round->num_samples > 0 ? round->loss_sum / static_cast<double>(round->num_samples) : 0;
    if (!result.contributors.empty()) {
      recycled = TakeEvictedBuffer(*task, round->base_version, round->base->layout);
    }
  }

  // The aggregation is ours now: apply it without holding the lock (one pass over the model for
  // mean; the strategy's work for the others).
  std::shared_ptr<const tensor::FlatModel> next;
  if (!result.contributors.empty() && HasDp(round->dp)) {
    // The noise and the fixed denominator (round_privacy.h).
    if (absl::Status s = AddRoundNoise(round->dp, round->dp_expected, result.contributors.size(),
                                       round->base->layout.total_elements(), *round->aggregation);
        !s.ok()) {
      absl::MutexLock lock(&mu_);
      round->state = Round::State::kAbandoned;
      return s;
    }
  }
  if (!result.contributors.empty()) {
    auto applied = std::make_shared<tensor::FlatModel>();
    applied->layout = round->base->layout;
    applied->values = std::move(recycled);
    absl::StatusOr<aggregation::AggregationReport> report =
        round->aggregation->ApplyInto(*round->base, applied->values);
    if (!report.ok()) {
      absl::MutexLock lock(&mu_);
      round->state = Round::State::kAbandoned;
      return report.status();
    }
    result.note = std::move(report->note);
    result.version = round->base_version + 1;
    result.digest = applied->Digest();
    next = std::move(applied);
  } else {
    result.version = round->base_version;
  }

  absl::MutexLock lock(&mu_);
  if (task->released || task->latest != round->base_version) {
    round->state = Round::State::kAbandoned;
    return absl::AbortedError(
        absl::StrCat(TaskLabel(name), " changed while round ", number, " was closing"));
  }
  if (next != nullptr) {
    PublishVersion(*task, result.version, std::move(next), result.digest);
  } else {
    result.digest = task->versions.at(result.version).digest;
    metrics_.model_version.Set(static_cast<double>(result.version));
  }
  result.model_bytes = task->versions.at(result.version).model->layout.total_bytes();
  round->state = Round::State::kClosed;
  task->closed[number] = result;
  while (task->closed.size() > static_cast<size_t>(options_.closed_rounds_kept)) {
    task->closed.erase(task->closed.begin());
  }
  metrics_.rounds_completed.Increment();
  metrics_.round_duration.Observe(absl::ToDoubleSeconds(clock_.Now() - round->opened_at));
  return result;
}

absl::Status AggregatorCore::FinishFolds(Round& round, const std::string& label) {
  round.state = Round::State::kClosing;
  // Pushes already folding finish first; no new fold starts once the round is closing.
  mu_.Await(absl::Condition(
      +[](Round* r) { return r->folds_in_flight == 0; }, &round));
  if (!round.fold_error.ok()) {
    // An accepted update is missing from the aggregate; publishing would silently drop it.
    round.state = Round::State::kAbandoned;
    return absl::InternalError(
        absl::StrCat(label, " lost an update: ", round.fold_error.message()));
  }
  return absl::OkStatus();
}

absl::Status AggregatorCore::TargetLateRound(Task& task, const PushMeta& meta, PushTarget& target) {
  std::shared_ptr<Round> round = task.round;
  auto last = task.late_rounds.find(meta.peer_id);
  if (last != task.late_rounds.end() && last->second == meta.round) {
    target.duplicate = true;  // a repeat of an accepted late push
    return absl::OkStatus();
  }
  const std::string label = RoundLabel(round->number, meta.task);
  if (round->state != Round::State::kOpen) {
    target.reason = RejectReason::kRoundNotOpen;
    return absl::UnavailableError(absl::StrCat("no round is open for the late update of peer '",
                                               EscapeBytes(meta.peer_id), "' (", label, " is ",
                                               RoundStateName(*round), "); retry"));
  }
  if (round->accepted.count(meta.peer_id) > 0) {
    // Its late update of an earlier round is in this one already: this one waits for the next.
    target.reason = RejectReason::kBusy;
    return absl::UnavailableError(absl::StrCat("peer '", EscapeBytes(meta.peer_id),
                                               "' already contributed to ", label,
                                               "; retry into the next round"));
  }
  if (meta.base_version > round->base_version) {
    target.reason = RejectReason::kStaleBase;
    return absl::FailedPreconditionError(absl::StrCat("update was trained from version ",
                                                      meta.base_version, ", newer than ", label,
                                                      "'s base version ", round->base_version));
  }
  const uint64_t staleness = round->base_version - meta.base_version;
  if (staleness > round->late_staleness.max_staleness()) {
    target.reason = RejectReason::kStale;
    return absl::FailedPreconditionError(
        absl::StrCat("late update was trained from version ", meta.base_version, ", ", staleness,
                     " versions behind ", label, " (max_staleness ",
                     round->late_staleness.max_staleness(), ")"));
  }
  if (round->pushing.count(meta.peer_id) > 0) {
    target.reason = RejectReason::kBusy;
    return absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                           "' into ", label, " is already in progress"));
  }
  target.staleness_factor = aggregation::StalenessFactor(round->late_staleness, staleness);
  target.model = round->base;
  target.max_norm = round->max_norm;
  target.round = std::move(round);
  return absl::OkStatus();
}

absl::Status AggregatorCore::CheckReplica(const Round& round, const PushMeta& meta,
                                          PushTarget& target) const {
  const std::string label = RoundLabel(round.number, meta.task);
  if (!meta.replicated_by.empty() && meta.replicated_by != round.primary) {
    target.reason = RejectReason::kUnexpectedPeer;
    return absl::FailedPreconditionError(
        absl::StrCat(label, " here is not a backup of '", EscapeBytes(meta.replicated_by), "'"));
  }
  if (meta.replicated_by.empty() && round.standby) {
    target.reason = RejectReason::kStandby;
    return absl::UnavailableError(
        absl::StrCat(label, " here is a standby backup of '", EscapeBytes(round.primary),
                     "'; push to the cluster's primary (this one takes pushes once promoted)"));
  }
  return absl::OkStatus();
}

absl::Status AggregatorCore::TargetRound(Task& task, const PushMeta& meta, PushTarget& target) {
  std::shared_ptr<Round> round = task.round;
  if (round != nullptr && round->number >= meta.round) {
    if (absl::Status s = CheckReplica(*round, meta, target); !s.ok()) return s;
  }
  if (round != nullptr && round->late.count(meta.peer_id) > 0 && meta.round <= round->number) {
    return TargetLateRound(task, meta, target);
  }
  if (round != nullptr && round->number == meta.round && round->accepted.count(meta.peer_id) > 0) {
    target.duplicate = true;  // a repeat of an accepted push
    return absl::OkStatus();
  }
  const std::string label = RoundLabel(meta.round, meta.task);
  if (round == nullptr || round->number != meta.round || round->state != Round::State::kOpen) {
    target.reason = RejectReason::kRoundNotOpen;
    return absl::FailedPreconditionError(absl::StrCat(
        label, " is not open",
        round ? absl::StrCat(" (current round ", round->number, " is ", RoundStateName(*round), ")")
              : std::string()));
  }
  if (round->expected.count(meta.peer_id) == 0) {
    target.reason = RejectReason::kUnexpectedPeer;
    return absl::FailedPreconditionError(
        absl::StrCat("peer '", EscapeBytes(meta.peer_id), "' is not expected in ", label));
  }
  if (meta.base_version != round->base_version) {
    target.reason = RejectReason::kStaleBase;
    return absl::FailedPreconditionError(absl::StrCat("update was trained from version ",
                                                      meta.base_version, " but ", label,
                                                      " folds into version ", round->base_version));
  }
  if (round->pushing.count(meta.peer_id) > 0) {
    target.reason = RejectReason::kBusy;
    return absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                           "' for round ", meta.round, " is already in progress"));
  }
  target.model = round->base;
  target.max_norm = round->max_norm;
  target.round = std::move(round);
  return absl::OkStatus();
}

absl::Status AggregatorCore::AcceptRoundPush(Push& push) {
  Round& round = *push.round_;
  bool standby = false;
  std::string replica_id;
  {
    absl::MutexLock lock(&mu_);
    if (round.state != Round::State::kOpen || push.task_->released) {
      const std::string label = RoundLabel(round.number, push.meta_.task);
      // An async peer's late update goes into whichever round is open: the next one takes it.
      if (!push.task_->released && round.late.count(push.meta_.peer_id) > 0) {
        return push.RejectWith(
            RejectReason::kRoundNotOpen,
            absl::UnavailableError(absl::StrCat(label, " closed before the late update of peer '",
                                                EscapeBytes(push.meta_.peer_id),
                                                "' was complete; retry into the next round")));
      }
      return push.RejectWith(RejectReason::kRoundNotOpen,
                             absl::FailedPreconditionError(
                                 absl::StrCat(label, " closed before the update was complete")));
    }
    // Counted now, folded by FoldRoundPush: CloseRound reads these only once folds_in_flight is
    // 0.
    ++round.folds_in_flight;
    round.accepted.insert(push.meta_.peer_id);
    if (round.late.count(push.meta_.peer_id) > 0) {
      push.task_->late_rounds[push.meta_.peer_id] = push.meta_.round;
    }
    round.num_samples += push.meta_.num_samples;
    round.loss_sum += push.meta_.train_loss * static_cast<double>(push.meta_.num_samples);
    if (!round.backups.empty() && push.meta_.replicated_by.empty()) {
      push.replica_.backups = round.backups;
      replica_id = round.replica_id;
    }
    standby = round.standby;
  }
  push.done_ = true;
  push.fold_pending_ = true;
  metrics_.updates_accepted.Increment();
  if (!push.replica_.backups.empty()) {
    // The copy for the backups: the peer's meta (and token) as it came, and the update as
    // decoded (a compressed push is copied dense). The values are copied so that the wire holds
    // them as long as it needs while the push folds its own.
    push.replica_.meta = push.meta_.ToProto();
    push.replica_.meta.set_replicated_by(replica_id);
    push.replica_.update = std::make_shared<const tensor::FlatModel>(
        tensor::FlatModel{round.base->layout, push.values_});
  }
  // A standby's copies are not news to the coordinator: the primary reported them.
  if (!standby) NotifyAccepted(push);
  return absl::OkStatus();
}

void AggregatorCore::FoldRoundPush(Push& push) {
  Round& round = *push.round_;
  push.fold_pending_ = false;
  // Cannot fail for a validated update (the decoder enforced the round's layout and finite
  // values, BeginPush a positive sample count, the round one push per peer); an error means a
  // broken invariant and is reported by CloseRound. `aggregation` is stable without mu_:
  // OpenRound only takes it from a closed round with no fold in flight, and this push holds a
  // folds_in_flight count. Mean adds the update to its running sum; the others copy it.
  if (push.staleness_factor_ < 1) {  // a late update: scaled as federated-async scales one
    const float f = static_cast<float>(push.staleness_factor_);
    for (float& v : push.values_) v *= f;
  }
  // Differential privacy weighs every update 1 (round_privacy.h: a fixed-denominator mean).
  const bool dp = HasDp(round.dp);
  if (dp) PrivatizeArrival(round.dp, absl::MakeSpan(push.values_));
  absl::Status s;
  {
    absl::MutexLock fold(&round.fold_mu);
    s = round.aggregation->Add(push.values_, dp ? 1.0 : static_cast<double>(push.meta_.num_samples),
                               push.meta_.peer_id);
  }
  absl::MutexLock lock(&mu_);
  if (!s.ok() && round.fold_error.ok()) round.fold_error = s;
  --round.folds_in_flight;
}

}  // namespace shoal::aggregator
