// AggregatorCore's tree rounds: a child supernode closes its round into a partial sum
// (ClosePartial) and its parent adds it to its own round (AddPartial). The core's state and
// locking are described in aggregator_core.h.

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_core_internal.h"

namespace shoal::aggregator {

absl::StatusOr<bool> AggregatorCore::AddPartial(const PartialMeta& meta,
                                                const aggregation::PartialSum& partial) {
  if (meta.round == 0) return AddBufferPartial(meta, partial);  // a federated-async tree
  const std::string label = RoundLabel(meta.round, meta.task);
  const std::string child = absl::StrCat("child '", EscapeBytes(meta.child), "'");
  if (meta.contributors.size() != partial.count) {
    return absl::InvalidArgumentError(absl::StrCat(child, " names ", meta.contributors.size(),
                                                   " contributors for a sum of ", partial.count,
                                                   " updates in ", label));
  }
  if (!std::isfinite(meta.loss_sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(child, "'s loss sum in ", label, " is not finite"));
  }
  if (meta.num_samples < meta.contributors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(child, " counts ", meta.num_samples,
                                                   " samples for ", meta.contributors.size(),
                                                   " contributors in ", label));
  }
  const std::set<std::string> contributors(meta.contributors.begin(), meta.contributors.end());
  if (contributors.size() != meta.contributors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(child, " names a contributor twice in ", label));
  }
  std::shared_ptr<Round> round;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Task> task = FindTask(meta.task);
    if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(meta.task)));
    round = task->round;
    if (round != nullptr && round->number == meta.round && round->children_in.count(meta.child)) {
      return true;  // a repeat of an accepted partial
    }
    if (round == nullptr || round->number != meta.round || round->state != Round::State::kOpen) {
      return absl::FailedPreconditionError(absl::StrCat(label, " is not open"));
    }
    if (round->children.count(meta.child) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(child, " is not expected in ", label));
    }
    if (meta.base_version != round->base_version) {
      return absl::FailedPreconditionError(
          absl::StrCat(child, " summed updates of version ", meta.base_version, " but ", label,
                       " folds into version ", round->base_version));
    }
    for (const std::string& peer : contributors) {
      if (round->accepted.count(peer) > 0 || round->pushing.count(peer) > 0 ||
          round->expected.count(peer) > 0 || round->late.count(peer) > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            child, "'s contributor '", EscapeBytes(peer), "' is a peer of ", label, " already"));
      }
    }
    // Counted now, so that a second partial naming the same peers is refused; undone below
    // when the sum itself is refused. CloseRound reads these only once folds_in_flight is 0.
    ++round->folds_in_flight;
    round->children_in.insert(meta.child);
    round->accepted.insert(contributors.begin(), contributors.end());
    round->num_samples += meta.num_samples;
    round->loss_sum += meta.loss_sum;
  }
  absl::Status added;
  {
    absl::MutexLock fold(&round->fold_mu);
    added = round->aggregation->AddPartial(partial);
  }
  absl::MutexLock lock(&mu_);
  if (!added.ok()) {
    round->children_in.erase(meta.child);
    for (const std::string& peer : contributors) round->accepted.erase(peer);
    round->num_samples -= meta.num_samples;
    round->loss_sum -= meta.loss_sum;
  }
  --round->folds_in_flight;
  if (!added.ok()) {
    const auto code = added.code() == absl::StatusCode::kFailedPrecondition
                          ? absl::StatusCode::kFailedPrecondition
                          : absl::StatusCode::kInvalidArgument;
    return absl::Status(code,
                        absl::StrCat(child, "'s partial sum for ", label, ": ", added.message()));
  }
  metrics_.partials_accepted.Increment();
  return false;
}

absl::StatusOr<std::shared_ptr<const PartialResult>> AggregatorCore::ClosePartial(
    const std::string& name, uint64_t number) {
  const std::string label = RoundLabel(number, name);
  std::shared_ptr<Round> round;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Task> task = FindTask(name);
    if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
    round = task->round;
    if (round == nullptr || round->number != number || round->state == Round::State::kAbandoned) {
      return absl::NotFoundError(absl::StrCat(label, " is not open"));
    }
    if (round->state == Round::State::kClosing) {
      // Another close is taking this round's sum; wait for it.
      mu_.Await(absl::Condition(
          +[](Round* r) { return r->state != Round::State::kClosing; }, round.get()));
    }
    if (round->partial != nullptr) return round->partial;
    if (round->state != Round::State::kOpen) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " is ", RoundStateName(*round), ", not open for a partial sum"));
    }
    if (absl::Status folded = FinishFolds(*round, label); !folded.ok()) return folded;
  }
  // The round is closing with no fold in flight: its sum is ours to copy without the lock.
  absl::StatusOr<aggregation::PartialSum> sum = round->aggregation->Partial(*round->base);
  absl::MutexLock lock(&mu_);
  if (!sum.ok() || round->state != Round::State::kClosing) {
    round->state = Round::State::kAbandoned;
    return sum.ok() ? absl::AbortedError(absl::StrCat(label, " was abandoned while closing"))
                    : sum.status();
  }
  auto result = std::make_shared<PartialResult>();
  result->meta.task = name;
  result->meta.round = number;
  result->meta.base_version = round->base_version;
  result->meta.contributors.assign(round->accepted.begin(), round->accepted.end());
  result->meta.num_samples = round->num_samples;
  result->meta.loss_sum = round->loss_sum;
  result->sum = *std::move(sum);
  round->partial = result;
  round->state = Round::State::kClosed;
  metrics_.rounds_completed.Increment();
  metrics_.round_duration.Observe(absl::ToDoubleSeconds(clock_.Now() - round->opened_at));
  return round->partial;
}

v1::ParentRound AggregatorCore::ParentOf(const std::string& name, uint64_t number) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(name);
  if (task == nullptr || task->round == nullptr || task->round->number != number) return {};
  return task->round->parent;
}

absl::StatusOr<size_t> AggregatorCore::PartialValues(const std::string& name,
                                                     uint64_t number) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(name);
  if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
  if (number == 0) {  // a federated-async tree: a child's aggregate into the buffer
    if (task->buffer == nullptr || task->versions.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(TaskLabel(name), " has no federated-async buffer open"));
    }
    return task->versions.at(task->latest).model->layout.total_elements();
  }
  const std::shared_ptr<Round>& round = task->round;
  if (round == nullptr || round->number != number || round->state != Round::State::kOpen) {
    return absl::FailedPreconditionError(absl::StrCat(RoundLabel(number, name), " is not open"));
  }
  return round->base->layout.total_elements();
}

absl::Status AggregatorCore::CheckPartialCaller(const std::string& child,
                                                const std::string& identity) {
  if (identity.empty() || identity == "coordinator" || IsChildOf(identity, child)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("certificate '", EscapeBytes(identity),
                                                  "' may not push child '", EscapeBytes(child),
                                                  "''s partial sum"));
}

absl::Status AggregatorCore::CheckChildCaller(const std::string& task, const std::string& child,
                                              const std::string& identity) const {
  absl::Status s = CheckPartialCaller(child, identity);
  if (s.ok()) return s;
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> t = FindTask(task);
  if (t == nullptr) return s;
  auto backups = t->child_backups.find(child);
  if (backups == t->child_backups.end()) return s;
  for (const std::string& backup : backups->second) {
    if (IsChildOf(identity, backup)) return absl::OkStatus();
  }
  return s;
}

}  // namespace shoal::aggregator
