#include "services/aggregator/sessions/buffer_session.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "services/aggregator/memory_budget.h"

namespace shoal::aggregator {

absl::StatusOr<std::shared_ptr<BufferSession>> BufferSession::Make(const OpenBufferParams& p,
                                                                   SessionHost& host) {
  BufferSettings settings{p.async,        p.aggregation, p.max_update_norm,
                          p.last_version, p.parent,      {p.children.begin(), p.children.end()}};
  if (settings.forwards() && p.parent.child().empty()) {
    return absl::InvalidArgumentError("parent.child: required with parent.address");
  }
  absl::StatusOr<std::unique_ptr<UpdateBuffer>> made = UpdateBuffer::Create(
      p.task, std::move(settings), p.base_version, host.options().fold_threads);
  if (!made.ok()) return made.status();
  return std::shared_ptr<BufferSession>(new BufferSession(host, *std::move(made)));
}

absl::StatusOr<std::shared_ptr<AggregationSession>> BufferSession::Open(
    TaskState& task, const std::shared_ptr<AggregationSession>& current) {
  const BufferSettings& settings = buffer_->settings();
  // The task's buffer so far, if it has one.
  auto* cur = dynamic_cast<BufferSession*>(current.get());
  // A repeat (e.g. a retry whose answer was lost) names the version the buffer opened on, or one
  // it has published since.
  if (cur != nullptr && cur->buffer_->SameSettings(*buffer_) &&
      buffer_->opened_on() >= cur->buffer_->opened_on() && buffer_->opened_on() <= task.latest) {
    cur->buffer_->Adjust(*buffer_);  // the tree's peers changed: its updates stay
    task.children.insert(settings.children.begin(), settings.children.end());
    return current;
  }
  if (current != nullptr && cur == nullptr) {
    if (absl::Status s = current->CheckReplaceable(task); !s.ok()) return s;
  }
  if (absl::Status base = CheckBaseIsLatest(task, buffer_->opened_on()); !base.ok()) return base;
  const uint64_t model_bytes = task.versions.at(task.latest).model->layout.total_bytes();
  if (absl::Status fits = CheckBufferMemory(buffer_->strategy(), buffer_->capacity(), model_bytes,
                                            host_.options().max_buffer_bytes,
                                            absl::StrCat("the buffer of ", TaskLabel(task.name)));
      !fits.ok()) {
    host_.metrics().max_buffer_refusals.Increment();
    return fits;
  }
  task.children.insert(settings.children.begin(), settings.children.end());
  return shared_from_this();
}

absl::Status BufferSession::CheckReplaceable(const TaskState& task) const {
  return absl::FailedPreconditionError(
      absl::StrCat(TaskLabel(task.name),
                   " aggregates in a federated-async buffer (OpenBuffer): it has no rounds"));
}

void BufferSession::Abandon() {
  if (abandoned_) return;
  abandoned_ = true;
  host_.metrics().buffered_updates.Decrement(static_cast<double>(buffer_->size()));
}

std::shared_ptr<AggregationSession> BufferSession::OnNewVersion(TaskState& task) {
  // A tree node's buffer takes its versions from its parent: its updates stay, now staler.
  if (buffer_->settings().forwards()) return shared_from_this();
  Abandon();
  return std::shared_ptr<BufferSession>(new BufferSession(host_, buffer_->Reopen(task.latest)));
}

// ---------------------------------------------------------------------------------------------
// Pushes

absl::Status BufferSession::Target(TaskState& task, const PushMeta& meta, PushTarget& target) {
  if (!meta.replicated_by.empty()) {
    target.reason = RejectReason::kUnexpectedPeer;
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(meta.task), " has no round with backups here (a copy from '",
                     EscapeBytes(meta.replicated_by), "')"));
  }
  if (meta.round != 0) {
    target.reason = RejectReason::kRoundNotOpen;
    return absl::FailedPreconditionError(
        absl::StrCat(RoundLabel(meta.round, meta.task),
                     " is not open (the task aggregates in a federated-async buffer)"));
  }
  UpdateBuffer::Admission admission = buffer_->Admit(meta.peer_id, meta.base_version, task.latest);
  if (admission.refusal.has_value()) {
    target.reason = admission.refusal->reason;
    return admission.refusal->status;
  }
  if (buffer_->pushing().count(meta.peer_id) > 0) {
    target.reason = RejectReason::kBusy;
    return absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                           "' into the buffer of ", TaskLabel(meta.task),
                                           " is already in progress"));
  }
  target.model = task.versions.at(task.latest).model;
  target.max_norm = buffer_->settings().max_update_norm;
  return absl::OkStatus();
}

Acceptance BufferSession::Accept(TaskState& task, PushedUpdate& pushed) {
  Acceptance out;
  const PushMeta& meta = pushed.meta;
  uint64_t staleness = 0;
  std::optional<UpdateBuffer::Update> replaced;  // its delta is freed outside the lock
  {
    absl::MutexLock lock(&host_.mu());
    if (!Current(task)) {
      out.status = absl::FailedPreconditionError(
          absl::StrCat("the buffer of ", TaskLabel(meta.task),
                       " was reset or released before the update was complete"));
      return out;
    }
    // Checked again: versions may have been published while the update streamed in.
    UpdateBuffer::Admission admission =
        buffer_->Admit(meta.peer_id, meta.base_version, task.latest);
    if (admission.refusal.has_value()) {
      out.reason = admission.refusal->reason;
      out.status = admission.refusal->status;
      return out;
    }
    staleness = admission.staleness;
    UpdateBuffer::Update update;
    update.peer = meta.peer_id;
    update.base_version = meta.base_version;
    update.staleness = staleness;
    update.num_samples = meta.num_samples;
    update.train_loss = meta.train_loss;
    update.sum_squares = pushed.sum_squares;
    if (buffer_->Repeats(update)) {
      out.duplicate = true;
      return out;
    }
    update.delta = std::move(pushed.values);
    replaced = buffer_->Put(std::move(update));
    if (!replaced.has_value()) host_.metrics().buffered_updates.Increment();
    out.fold_pending = buffer_->ClaimPass();
  }
  host_.metrics().updates_accepted.Increment();
  host_.metrics().update_staleness.Observe(static_cast<double>(staleness));
  NotifyAccepted(host_, meta.round, pushed);
  return out;
}

void BufferSession::Fold(const std::shared_ptr<TaskState>& task, PushedUpdate&) { RunPasses(task); }

void BufferSession::RunPasses(const std::shared_ptr<TaskState>& task) {
  for (;;) {
    std::vector<UpdateBuffer::Update> updates;
    std::shared_ptr<const tensor::FlatModel> base;
    uint64_t base_version = 0;
    std::unique_ptr<RoundAggregation> aggregation;
    auto next = std::make_shared<tensor::FlatModel>();
    {
      absl::MutexLock lock(&host_.mu());
      // A reset or released buffer is no longer the task's: its updates are dropped.
      if (!Current(*task)) return;
      std::optional<std::vector<UpdateBuffer::Update>> taken = buffer_->TakeFullPass();
      if (!taken.has_value()) return;  // not full: this runner's turn ends
      updates = *std::move(taken);
      host_.metrics().buffered_updates.Decrement(static_cast<double>(updates.size()));
      base_version = task->latest;
      base = task->versions.at(base_version).model;
      if (buffer_->settings().forwards()) {
        // A tree node's updates may have waited across versions fetched from its parent: the
        // aggregate is against the latest, so each is as stale as it is now.
        for (UpdateBuffer::Update& u : updates) {
          if (!u.merged && base_version > u.base_version) {
            u.staleness = std::max(u.staleness, base_version - u.base_version);
          }
        }
      }
      next->layout = base->layout;
      next->values = host_.TakeEvictedBuffer(*task, base_version, base->layout);
      aggregation = buffer_->TakeAggregation(base->layout);
    }

    // The pass over the model, without the lock. Each update's buffer goes back to the staging
    // pool once it is folded in (mean) or copied (the others).
    const bool streaming = aggregation->streaming();
    absl::StatusOr<UpdateBuffer::PassResult> result =
        UpdateBuffer::RunPass(updates, *aggregation, buffer_->settings().async, *base, next->values,
                              [this, streaming](UpdateBuffer::Update& update) {
                                if (streaming) {
                                  absl::MutexLock lock(&host_.mu());
                                  buffer_->Folded();
                                }
                                host_.RecycleBuffer(std::move(update.delta));
                              });
    uint64_t digest = 0;  // of a version this node publishes
    if (result.ok() && !buffer_->settings().forwards()) digest = next->Digest();

    if (buffer_->settings().forwards()) {
      // A tree's node below the root: the aggregate goes to the parent as one update; the
      // node's versions come from there.
      {
        absl::MutexLock lock(&host_.mu());
        if (!Current(*task)) return;
        buffer_->PassDone();
        if (result.ok()) buffer_->KeepAggregation(std::move(aggregation));
      }
      if (!result.ok()) {
        LogError("the buffer of ", TaskLabel(task->name), " lost ", updates.size(),
                 " updates aggregating on version ", base_version, ": ",
                 result.status().ToString());
        continue;
      }
      PartialResult aggregate;
      aggregate.meta.task = task->name;
      aggregate.meta.base_version = base_version;
      aggregate.meta.contributors = std::move(result->contributors);
      aggregate.meta.num_samples = result->num_samples;
      aggregate.meta.loss_sum = result->mean_train_loss * static_cast<double>(result->num_samples);
      for (size_t i = 0; i < next->values.size(); ++i) next->values[i] -= base->values[i];
      aggregate.sum.sum = std::move(next->values);
      aggregate.sum.count = aggregate.meta.contributors.size();
      aggregate.sum.total_weight = 1;
      host_.Forward(buffer_->settings().parent, std::move(aggregate));
      continue;
    }

    v1::TaskEvent event;
    {
      absl::MutexLock lock(&host_.mu());
      if (!Current(*task)) return;  // a restore superseded this version
      buffer_->PassDone();
      if (!result.ok()) {
        // Cannot happen for validated updates (an invariant broke). Nobody is waiting for this
        // pass to answer, so it is reported here; the next full buffer is aggregated as usual.
        LogError("the buffer of ", TaskLabel(task->name), " lost ", updates.size(),
                 " updates aggregating version ", base_version + 1, ": ",
                 result.status().ToString());
        continue;
      }
      const uint64_t version = base_version + 1;
      host_.PublishVersion(*task, version, std::move(next), digest);
      if (!buffer_->Finished(version)) buffer_->KeepAggregation(std::move(aggregation));
      host_.metrics().versions_published.Increment();
      v1::VersionPublished& published = *event.mutable_version_published();
      published.set_version(version);
      for (const std::string& peer : result->contributors) published.add_contributors(peer);
      published.set_num_samples(result->num_samples);
      published.set_mean_train_loss(result->mean_train_loss);
      published.set_digest_xxh3(digest);
      published.set_mean_staleness(result->mean_staleness);
      published.set_note(result->report.note);
      published.set_published_unix_ms(absl::ToUnixMillis(host_.clock().Now()));
    }
    host_.Notify(task->name, event);
  }
}

// ---------------------------------------------------------------------------------------------
// What a buffer does not have: rounds to close

absl::StatusOr<RoundResult> BufferSession::Close(TaskState& task, uint64_t round) {
  return absl::NotFoundError(
      absl::StrCat(RoundLabel(round, task.name), " is not open (the task aggregates in a buffer)"));
}

absl::StatusOr<std::shared_ptr<const PartialResult>> BufferSession::ClosePartial(TaskState& task,
                                                                                 uint64_t round) {
  return absl::NotFoundError(
      absl::StrCat(RoundLabel(round, task.name), " is not open (the task aggregates in a buffer)"));
}

// ---------------------------------------------------------------------------------------------
// A federated-async tree: the children's aggregates

absl::StatusOr<bool> BufferSession::AddPartial(const std::shared_ptr<TaskState>& task,
                                               const PartialMeta& meta,
                                               const aggregation::PartialSum& aggregate) {
  if (meta.round != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        RoundLabel(meta.round, meta.task), " is not open (the task aggregates in a buffer)"));
  }
  const std::string child = absl::StrCat("child '", EscapeBytes(meta.child), "'");
  if (aggregate.summation != aggregation::Summation::kFloat || aggregate.total_weight != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        child, "'s aggregate for a federated-async buffer must be float32 with total_weight 1"));
  }
  if (meta.contributors.empty() || meta.num_samples < meta.contributors.size() ||
      !std::isfinite(meta.loss_sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(child, "'s aggregate names ", meta.contributors.size(), " contributors, ",
                     meta.num_samples, " samples and loss sum ", meta.loss_sum));
  }
  double sum_squares = 0;
  for (float v : aggregate.sum) {
    if (!std::isfinite(v)) {
      host_.metrics().RejectedCounter(RejectReason::kNonFinite).Increment();
      return absl::InvalidArgumentError(absl::StrCat(child, "'s aggregate has a non-finite value"));
    }
    sum_squares += static_cast<double>(v) * v;
  }
  bool run_pass = false;
  {
    absl::MutexLock lock(&host_.mu());
    if (!Current(*task)) {
      return absl::FailedPreconditionError(
          absl::StrCat(TaskLabel(meta.task), " has no federated-async buffer open"));
    }
    if (buffer_->settings().children.count(meta.child) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(child, " is not a child of the buffer of ", TaskLabel(meta.task)));
    }
    const size_t values = task->versions.at(task->latest).model->layout.total_elements();
    if (aggregate.sum.size() != values) {
      return absl::InvalidArgumentError(absl::StrCat(
          child, "'s aggregate has ", aggregate.sum.size(), " values; the model has ", values));
    }
    UpdateBuffer::Admission admission = buffer_->Admit(meta.child, meta.base_version, task->latest);
    if (admission.refusal.has_value()) return admission.refusal->status;
    UpdateBuffer::Update update;
    update.peer = meta.child;
    update.base_version = meta.base_version;
    update.staleness = admission.staleness;
    update.num_samples = meta.num_samples;
    update.train_loss = meta.loss_sum / static_cast<double>(meta.num_samples);
    update.sum_squares = sum_squares;
    update.contributors = meta.contributors;
    if (buffer_->Repeats(update)) return true;
    update.delta = aggregate.sum;
    if (!buffer_->Merge(update) && !buffer_->Put(std::move(update)).has_value()) {
      host_.metrics().buffered_updates.Increment();
    }
    run_pass = buffer_->ClaimPass();
    host_.metrics().update_staleness.Observe(static_cast<double>(admission.staleness));
  }
  host_.metrics().partials_accepted.Increment();
  if (run_pass) RunPasses(task);
  return false;
}

absl::StatusOr<size_t> BufferSession::PartialValues(const TaskState& task, uint64_t round) const {
  if (round != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(RoundLabel(round, task.name), " is not open"));
  }
  return task.versions.at(task.latest).model->layout.total_elements();
}

void BufferSession::Describe(v1::WatchStarted& started) const {
  for (const std::string& peer : buffer_->Pending()) started.add_accepted(peer);
}

}  // namespace shoal::aggregator
