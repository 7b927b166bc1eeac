#include "services/aggregator/sessions/round_session.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/async_spec.h"
#include "libs/common/escape.h"
#include "services/aggregator/memory_budget.h"
#include "services/aggregator/round_privacy.h"

namespace shoal::aggregator {

absl::StatusOr<std::shared_ptr<RoundSession>> RoundSession::Make(const OpenRoundParams& p,
                                                                 SessionHost& host) {
  if (p.round == 0) return absl::InvalidArgumentError("round must be >= 1");
  if (!(p.max_update_norm >= 0) || !std::isfinite(p.max_update_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_update_norm must be finite and >= 0, got ", p.max_update_norm));
  }
  absl::StatusOr<aggregation::Strategy> strategy =
      StrategyFor(p.aggregation, host.options().fold_threads);
  if (!strategy.ok()) return strategy.status();
  std::set<std::string> expected(p.expected_peers.begin(), p.expected_peers.end());
  std::set<std::string> late(p.late_peers.begin(), p.late_peers.end());
  const std::string label = RoundLabel(p.round, p.task);
  for (const std::string& id : late) {
    if (expected.count(id) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer '", EscapeBytes(id), "' is both expected and late in ", label));
    }
  }
  absl::StatusOr<TreePartials> tree = TreePartials::Make(p, expected, late, label);
  if (!tree.ok()) return tree.status();
  if (!p.standby_for.empty() && !p.backups.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": a backup's round (standby_for) has no backups of its own"));
  }
  if (!p.parent.address().empty() || !p.parent.child().empty()) {
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
  return std::shared_ptr<RoundSession>(
      new RoundSession(host, p, *std::move(strategy), std::move(expected), std::move(late),
                       *std::move(tree), std::move(late_staleness)));
}

RoundSession::RoundSession(SessionHost& host, OpenRoundParams p, aggregation::Strategy strategy,
                           std::set<std::string> expected, std::set<std::string> late,
                           TreePartials tree, common::v1::AsyncSpec late_staleness)
    : host_(host),
      number_(p.round),
      base_version_(p.base_version),
      expected_(std::move(expected)),
      late_(std::move(late)),
      tree_(std::move(tree)),
      backups_(p.backups),
      replica_id_(p.replica_id.empty() ? p.parent.child() : p.replica_id),
      primary_(p.standby_for),
      standby_(!p.standby_for.empty()),
      late_staleness_(std::move(late_staleness)),
      max_norm_(p.max_update_norm),
      dp_(std::move(p.dp)),
      dp_expected_(DpRoundPeers(p)),
      strategy_(std::move(strategy)) {}

const char* RoundSession::StateName() const {
  switch (state_) {
    case State::kOpen:
      return "open";
    case State::kClosing:
      return "closing";
    case State::kClosed:
      return "closed";
    case State::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

void RoundSession::TakeMembers(TaskState& task, const RoundSession& request) {
  expected_ = request.expected_;
  tree_.Renew(task, request.tree_);
  // A round opened again without standby_for is promoted: it keeps its primary's id (copies
  // still in flight from it are counted once) and takes the peers' own pushes from then on.
  backups_ = request.backups_;
  replica_id_ = request.replica_id_;
  standby_ = request.standby_;
  if (standby_) primary_ = request.primary_;
  late_ = request.late_;
  late_staleness_ = request.late_staleness_;
  max_norm_ = request.max_norm_;
}

absl::StatusOr<std::shared_ptr<AggregationSession>> RoundSession::Open(
    TaskState& task, const std::shared_ptr<AggregationSession>& current) {
  const std::string label = RoundLabel(number_, task.name);
  // The task's previous round, if it had one.
  auto* cur = dynamic_cast<RoundSession*>(current.get());
  if (current != nullptr && cur == nullptr) {
    if (absl::Status s = current->CheckReplaceable(task); !s.ok()) return s;
  }
  // Every expected and late peer may contribute one update.
  const size_t contributors = expected_.size() + late_.size();
  const uint64_t model_bytes = task.versions.at(task.latest).model->layout.total_bytes();
  auto fits = [&]() {
    absl::Status s = CheckRoundMemory(strategy_, contributors, model_bytes,
                                      host_.options().max_buffer_bytes, label);
    if (!s.ok()) host_.metrics().max_buffer_refusals.Increment();
    return s;
  };
  if (cur != nullptr && cur->number_ == number_) {
    if (cur->state_ == State::kOpen) {
      if (cur->base_version_ != base_version_) {
        return absl::FailedPreconditionError(absl::StrCat(
            label, " is open with base version ", cur->base_version_, ", not ", base_version_));
      }
      if (!cur->aggregation_->Fits(strategy_, cur->base_->layout)) {
        return absl::FailedPreconditionError(absl::StrCat(label, " is open with aggregation ",
                                                          cur->strategy_.name(), ", not ",
                                                          strategy_.name()));
      }
      // Idempotent re-open; the latest expected set and bound win.
      if (absl::Status s = fits(); !s.ok()) return s;
      cur->TakeMembers(task, *this);
      if (HasDp(dp_) && !HasDp(cur->dp_)) {
        return absl::FailedPreconditionError(
            absl::StrCat(label, " is open without differential privacy"));
      }
      return current;
    }
    if (cur->state_ == State::kClosed && cur->tree_.made() != nullptr && tree_.child_round() &&
        cur->base_version_ == base_version_) {
      // A child's round whose partial sum is made, opened again with another parent (the root's
      // backup took over): the sum goes there at the next CloseRound; nothing else changes.
      cur->tree_.Reparent(tree_);
      return current;
    }
    return absl::FailedPreconditionError(absl::StrCat(label, " is already ", cur->StateName()));
  }
  if (cur != nullptr && (cur->history_->closed.count(number_) > 0 || number_ < cur->number_)) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, " is older than the current round ", cur->number_));
  }
  if (cur != nullptr && cur->state_ == State::kClosing) {
    return absl::AbortedError(
        absl::StrCat(RoundLabel(cur->number_, task.name), " is still closing; retry"));
  }
  if (absl::Status base = CheckBaseIsLatest(task, base_version_); !base.ok()) return base;
  if (absl::Status s = fits(); !s.ok()) return s;
  base_ = task.versions.at(base_version_).model;
  tree_.Register(task);
  opened_at_ = host_.clock().Now();
  history_ = cur != nullptr ? cur->history_ : std::make_shared<History>();
  // Reuse the previous round's aggregation (mean: its sum buffer; the others: their update
  // copies) when nothing can touch it any more and it fits.
  if (cur != nullptr && cur->state_ == State::kClosed && cur->folds_in_flight_ == 0 &&
      cur->aggregation_ != nullptr && cur->aggregation_->Fits(strategy_, base_->layout)) {
    aggregation_ = std::move(cur->aggregation_);
    aggregation_->Reset();
  } else {
    aggregation_ = std::make_unique<RoundAggregation>(strategy_, base_->layout, contributors,
                                                      host_.options().fold_threads);
  }
  return shared_from_this();
}

absl::Status RoundSession::CheckReplaceable(const TaskState& task) const {
  if (state_ == State::kClosing) {
    return absl::AbortedError(
        absl::StrCat("round ", number_, " of ", TaskLabel(task.name), " is still closing; retry"));
  }
  return absl::OkStatus();
}

void RoundSession::Abandon() {
  if (state_ == State::kOpen) state_ = State::kAbandoned;
}

std::shared_ptr<AggregationSession> RoundSession::OnNewVersion(TaskState&) {
  Abandon();
  return shared_from_this();
}

// ---------------------------------------------------------------------------------------------
// Pushes

absl::Status RoundSession::CheckReplica(const PushMeta& meta, PushTarget& target) const {
  const std::string label = RoundLabel(number_, meta.task);
  if (!meta.replicated_by.empty() && meta.replicated_by != primary_) {
    target.reason = RejectReason::kUnexpectedPeer;
    return absl::FailedPreconditionError(
        absl::StrCat(label, " here is not a backup of '", EscapeBytes(meta.replicated_by), "'"));
  }
  if (meta.replicated_by.empty() && standby_) {
    target.reason = RejectReason::kStandby;
    return absl::UnavailableError(
        absl::StrCat(label, " here is a standby backup of '", EscapeBytes(primary_),
                     "'; push to the cluster's primary (this one takes pushes once promoted)"));
  }
  return absl::OkStatus();
}

absl::Status RoundSession::Target(TaskState& task, const PushMeta& meta, PushTarget& target) {
  if (meta.round == 0) {
    if (!meta.replicated_by.empty()) {
      target.reason = RejectReason::kUnexpectedPeer;
      return absl::FailedPreconditionError(
          absl::StrCat(TaskLabel(meta.task), " has no round with backups here (a copy from '",
                       EscapeBytes(meta.replicated_by), "')"));
    }
    target.reason = RejectReason::kRoundNotOpen;
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(meta.task),
                     " has no federated-async buffer open (round 0 pushes go to a buffer)"));
  }
  if (number_ >= meta.round) {
    if (absl::Status s = CheckReplica(meta, target); !s.ok()) return s;
  }
  if (late_.count(meta.peer_id) > 0 && meta.round <= number_) {
    return TargetLate(task, meta, target);
  }
  if (number_ == meta.round && accepted_.count(meta.peer_id) > 0) {
    target.duplicate = true;  // a repeat of an accepted push
    return absl::OkStatus();
  }
  const std::string label = RoundLabel(meta.round, meta.task);
  if (number_ != meta.round || state_ != State::kOpen) {
    target.reason = RejectReason::kRoundNotOpen;
    return absl::FailedPreconditionError(
        absl::StrCat(label, " is not open (current round ", number_, " is ", StateName(), ")"));
  }
  if (expected_.count(meta.peer_id) == 0) {
    target.reason = RejectReason::kUnexpectedPeer;
    return absl::FailedPreconditionError(
        absl::StrCat("peer '", EscapeBytes(meta.peer_id), "' is not expected in ", label));
  }
  if (meta.base_version != base_version_) {
    target.reason = RejectReason::kStaleBase;
    return absl::FailedPreconditionError(absl::StrCat("update was trained from version ",
                                                      meta.base_version, " but ", label,
                                                      " folds into version ", base_version_));
  }
  if (pushing_.count(meta.peer_id) > 0) {
    target.reason = RejectReason::kBusy;
    return absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                           "' for round ", meta.round, " is already in progress"));
  }
  target.model = base_;
  target.max_norm = max_norm_;
  return absl::OkStatus();
}

absl::Status RoundSession::TargetLate(TaskState&, const PushMeta& meta, PushTarget& target) {
  auto last = history_->late_rounds.find(meta.peer_id);
  if (last != history_->late_rounds.end() && last->second == meta.round) {
    target.duplicate = true;  // a repeat of an accepted late push
    return absl::OkStatus();
  }
  const std::string label = RoundLabel(number_, meta.task);
  if (state_ != State::kOpen) {
    target.reason = RejectReason::kRoundNotOpen;
    return absl::UnavailableError(absl::StrCat("no round is open for the late update of peer '",
                                               EscapeBytes(meta.peer_id), "' (", label, " is ",
                                               StateName(), "); retry"));
  }
  if (accepted_.count(meta.peer_id) > 0) {
    // Its late update of an earlier round is in this one already: this one waits for the next.
    target.reason = RejectReason::kBusy;
    return absl::UnavailableError(absl::StrCat("peer '", EscapeBytes(meta.peer_id),
                                               "' already contributed to ", label,
                                               "; retry into the next round"));
  }
  if (meta.base_version > base_version_) {
    target.reason = RejectReason::kStaleBase;
    return absl::FailedPreconditionError(absl::StrCat("update was trained from version ",
                                                      meta.base_version, ", newer than ", label,
                                                      "'s base version ", base_version_));
  }
  const uint64_t staleness = base_version_ - meta.base_version;
  if (staleness > late_staleness_.max_staleness()) {
    target.reason = RejectReason::kStale;
    return absl::FailedPreconditionError(absl::StrCat(
        "late update was trained from version ", meta.base_version, ", ", staleness,
        " versions behind ", label, " (max_staleness ", late_staleness_.max_staleness(), ")"));
  }
  if (pushing_.count(meta.peer_id) > 0) {
    target.reason = RejectReason::kBusy;
    return absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                           "' into ", label, " is already in progress"));
  }
  target.staleness_factor = aggregation::StalenessFactor(late_staleness_, staleness);
  target.model = base_;
  target.max_norm = max_norm_;
  return absl::OkStatus();
}

Acceptance RoundSession::Accept(TaskState& task, PushedUpdate& update) {
  Acceptance out;
  bool standby = false;
  std::string replica_id;
  const PushMeta& meta = update.meta;
  {
    absl::MutexLock lock(&host_.mu());
    if (state_ != State::kOpen || task.released) {
      const std::string label = RoundLabel(number_, meta.task);
      // An async peer's late update goes into whichever round is open: the next one takes it.
      if (!task.released && late_.count(meta.peer_id) > 0) {
        out.status = absl::UnavailableError(
            absl::StrCat(label, " closed before the late update of peer '",
                         EscapeBytes(meta.peer_id), "' was complete; retry into the next round"));
      } else {
        out.status = absl::FailedPreconditionError(
            absl::StrCat(label, " closed before the update was complete"));
      }
      return out;
    }
    // Counted now, folded by Fold: a close reads these only once folds_in_flight_ is 0.
    ++folds_in_flight_;
    accepted_.insert(meta.peer_id);
    if (late_.count(meta.peer_id) > 0) history_->late_rounds[meta.peer_id] = meta.round;
    num_samples_ += meta.num_samples;
    loss_sum_ += meta.train_loss * static_cast<double>(meta.num_samples);
    if (!backups_.empty() && meta.replicated_by.empty()) {
      out.replica.backups = backups_;
      replica_id = replica_id_;
    }
    standby = standby_;
  }
  out.fold_pending = true;
  host_.metrics().updates_accepted.Increment();
  if (!out.replica.backups.empty()) {
    // The copy for the backups: the peer's meta (and token) as it came, and the update as
    // decoded (a compressed push is copied dense). The values are copied so that the wire holds
    // them as long as it needs while the push folds its own.
    out.replica.meta = meta.ToProto();
    out.replica.meta.set_replicated_by(replica_id);
    out.replica.update =
        std::make_shared<const tensor::FlatModel>(tensor::FlatModel{base_->layout, update.values});
  }
  // A standby's copies are not news to the coordinator: the primary reported them.
  if (!standby) NotifyAccepted(host_, number_, update);
  return out;
}

void RoundSession::Fold(const std::shared_ptr<TaskState>&, PushedUpdate& update) {
  // Cannot fail for a validated update (the decoder enforced the round's layout and finite
  // values, BeginPush a positive sample count, the round one push per peer); an error means a
  // broken invariant and is reported by the close. `aggregation_` is stable without mu():
  // Open only takes it from a closed round with no fold in flight, and this update holds a
  // folds_in_flight_ count. Mean adds the update to its running sum; the others copy it.
  if (update.staleness_factor < 1) {  // a late update: scaled as federated-async scales one
    const float f = static_cast<float>(update.staleness_factor);
    for (float& v : update.values) v *= f;
  }
  // Differential privacy weighs every update 1 (round_privacy.h: a fixed-denominator mean).
  const bool dp = HasDp(dp_);
  if (dp) PrivatizeArrival(dp_, absl::MakeSpan(update.values));
  absl::Status s;
  {
    absl::MutexLock fold(&fold_mu_);
    s = aggregation_->Add(update.values, dp ? 1.0 : static_cast<double>(update.meta.num_samples),
                          update.meta.peer_id);
  }
  absl::MutexLock lock(&host_.mu());
  if (!s.ok() && fold_error_.ok()) fold_error_ = s;
  --folds_in_flight_;
}

// ---------------------------------------------------------------------------------------------
// Closing

void RoundSession::AwaitClosing() {
  host_.mu().Await(absl::Condition(
      +[](RoundSession* r) { return r->state_ != State::kClosing; }, this));
}

absl::Status RoundSession::FinishFolds(const std::string& label) {
  state_ = State::kClosing;
  // Pushes already folding finish first; no new fold starts once the round is closing.
  host_.mu().Await(absl::Condition(
      +[](RoundSession* r) { return r->folds_in_flight_ == 0; }, this));
  if (!fold_error_.ok()) {
    // An accepted update is missing from the aggregate; publishing would silently drop it.
    state_ = State::kAbandoned;
    return absl::InternalError(absl::StrCat(label, " lost an update: ", fold_error_.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<RoundResult> RoundSession::Close(TaskState& task, uint64_t number) {
  RoundResult result;
  std::vector<float> recycled;
  const std::string label = RoundLabel(number, task.name);
  {
    absl::MutexLock lock(&host_.mu());
    if (auto it = history_->closed.find(number); it != history_->closed.end()) return it->second;
    if (number_ != number || state_ == State::kAbandoned) {
      return absl::NotFoundError(absl::StrCat(label, " is not open"));
    }
    if (state_ == State::kClosing) {
      // Another CloseRound is applying this round; wait for its result.
      AwaitClosing();
      if (auto it = history_->closed.find(number); it != history_->closed.end()) return it->second;
      return absl::AbortedError(absl::StrCat(label, " was abandoned while closing"));
    }
    if (tree_.made() != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " was closed as a partial sum for its parent"));
    }
    if (absl::Status folded = FinishFolds(label); !folded.ok()) return folded;
    result.contributors.assign(accepted_.begin(), accepted_.end());
    result.num_samples = num_samples_;
    result.mean_train_loss = num_samples_ > 0 ? loss_sum_ / static_cast<double>(num_samples_) : 0;
    // Mean makes the new version in its running sum's buffer; the version it evicts then goes
    // back to the staging pool (PublishVersion), which keeps the buffers at the pushes + 2.
    if (!result.contributors.empty() && !aggregation_->AppliesInPlace()) {
      recycled = host_.TakeEvictedBuffer(task, base_version_, base_->layout);
    }
  }

  // The aggregation is ours now: apply it without holding the lock (one pass over the model for
  // mean; the strategy's work for the others).
  std::shared_ptr<const tensor::FlatModel> next;
  if (!result.contributors.empty() && HasDp(dp_)) {
    // The noise and the fixed denominator (round_privacy.h).
    if (absl::Status s = AddRoundNoise(dp_, dp_expected_, result.contributors.size(),
                                       base_->layout.total_elements(), *aggregation_);
        !s.ok()) {
      absl::MutexLock lock(&host_.mu());
      state_ = State::kAbandoned;
      return s;
    }
  }
  if (!result.contributors.empty()) {
    auto applied = std::make_shared<tensor::FlatModel>();
    applied->layout = base_->layout;
    applied->values = std::move(recycled);
    absl::StatusOr<aggregation::AggregationReport> report =
        aggregation_->ApplyInto(*base_, applied->values);
    if (!report.ok()) {
      absl::MutexLock lock(&host_.mu());
      state_ = State::kAbandoned;
      return report.status();
    }
    result.note = std::move(report->note);
    result.version = base_version_ + 1;
    result.digest = applied->Digest();
    next = std::move(applied);
  } else {
    result.version = base_version_;
  }

  absl::MutexLock lock(&host_.mu());
  if (task.released || task.latest != base_version_) {
    state_ = State::kAbandoned;
    return absl::AbortedError(
        absl::StrCat(TaskLabel(task.name), " changed while round ", number, " was closing"));
  }
  if (next != nullptr) {
    host_.PublishVersion(task, result.version, std::move(next), result.digest);
  } else {
    result.digest = task.versions.at(result.version).digest;
    host_.metrics().model_version.Set(static_cast<double>(result.version));
  }
  result.model_bytes = task.versions.at(result.version).model->layout.total_bytes();
  state_ = State::kClosed;
  history_->closed[number] = result;
  while (history_->closed.size() > static_cast<size_t>(host_.options().closed_rounds_kept)) {
    history_->closed.erase(history_->closed.begin());
  }
  host_.metrics().rounds_completed.Increment();
  host_.metrics().round_duration.Observe(absl::ToDoubleSeconds(host_.clock().Now() - opened_at_));
  return result;
}

// ---------------------------------------------------------------------------------------------
// Tree partial sums

absl::StatusOr<bool> RoundSession::AddPartial(const std::shared_ptr<TaskState>& task,
                                              const PartialMeta& meta,
                                              const aggregation::PartialSum& partial) {
  if (meta.round == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(meta.task), " has no federated-async buffer open"));
  }
  absl::StatusOr<std::set<std::string>> contributors = TreePartials::CheckSum(meta, partial);
  if (!contributors.ok()) return contributors.status();
  if (HasDp(dp_)) {
    // The root's noise and denominator count updates: each must weigh 1 (round_privacy.h).
    if (absl::Status s =
            CheckDpPartial(partial.count, partial.total_weight,
                           absl::StrCat("child '", EscapeBytes(meta.child), "'s partial sum for ",
                                        RoundLabel(meta.round, meta.task)));
        !s.ok()) {
      return s;
    }
  }
  {
    absl::MutexLock lock(&host_.mu());
    TreePartials::Round round;
    round.number = number_;
    round.open = state_ == State::kOpen && task->session.get() == this;
    round.base_version = base_version_;
    round.has_peer = [this](const std::string& peer) {
      return accepted_.count(peer) > 0 || pushing_.count(peer) > 0 || expected_.count(peer) > 0 ||
             late_.count(peer) > 0;
    };
    absl::StatusOr<bool> repeat = tree_.Admit(meta, *contributors, round);
    if (!repeat.ok() || *repeat) return repeat;
    // Counted now, so that a second partial naming the same peers is refused; undone below
    // when the sum itself is refused. A close reads these only once folds_in_flight_ is 0.
    ++folds_in_flight_;
    accepted_.insert(contributors->begin(), contributors->end());
    num_samples_ += meta.num_samples;
    loss_sum_ += meta.loss_sum;
  }
  absl::Status added;
  {
    absl::MutexLock fold(&fold_mu_);
    added = aggregation_->AddPartial(partial);
  }
  absl::MutexLock lock(&host_.mu());
  --folds_in_flight_;
  if (!added.ok()) {
    for (const std::string& peer : *contributors) accepted_.erase(peer);
    num_samples_ -= meta.num_samples;
    loss_sum_ -= meta.loss_sum;
    return tree_.Refuse(meta, added);
  }
  host_.metrics().partials_accepted.Increment();
  return false;
}

absl::StatusOr<std::shared_ptr<const PartialResult>> RoundSession::ClosePartial(TaskState& task,
                                                                                uint64_t number) {
  const std::string label = RoundLabel(number, task.name);
  {
    absl::MutexLock lock(&host_.mu());
    if (number_ != number || state_ == State::kAbandoned) {
      return absl::NotFoundError(absl::StrCat(label, " is not open"));
    }
    if (state_ == State::kClosing) AwaitClosing();  // another close is taking this round's sum
    if (tree_.made() != nullptr) return tree_.made();
    if (state_ != State::kOpen) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " is ", StateName(), ", not open for a partial sum"));
    }
    if (absl::Status folded = FinishFolds(label); !folded.ok()) return folded;
  }
  // The round is closing with no fold in flight: its sum is ours to copy without the lock.
  absl::StatusOr<aggregation::PartialSum> sum = aggregation_->Partial(*base_);
  absl::MutexLock lock(&host_.mu());
  if (!sum.ok() || state_ != State::kClosing) {
    state_ = State::kAbandoned;
    return sum.ok() ? absl::AbortedError(absl::StrCat(label, " was abandoned while closing"))
                    : sum.status();
  }
  std::shared_ptr<const PartialResult> result = tree_.Finish(
      task.name, number, base_version_, accepted_, num_samples_, loss_sum_, *std::move(sum));
  state_ = State::kClosed;
  host_.metrics().rounds_completed.Increment();
  host_.metrics().round_duration.Observe(absl::ToDoubleSeconds(host_.clock().Now() - opened_at_));
  return result;
}

absl::StatusOr<size_t> RoundSession::PartialValues(const TaskState& task, uint64_t number) const {
  if (number == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(task.name), " has no federated-async buffer open"));
  }
  if (number_ != number || state_ != State::kOpen) {
    return absl::FailedPreconditionError(
        absl::StrCat(RoundLabel(number, task.name), " is not open"));
  }
  return base_->layout.total_elements();
}

v1::ParentRound RoundSession::ParentOf(uint64_t number) const {
  return number == number_ ? tree_.parent() : v1::ParentRound();
}

void RoundSession::Describe(v1::WatchStarted& started) const {
  if (state_ != State::kOpen) return;
  started.set_open_round(number_);
  for (const std::string& peer : accepted_) started.add_accepted(peer);
}

}  // namespace shoal::aggregator
