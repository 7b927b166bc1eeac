// AggregatorCore's federated-async buffer: OpenBuffer, the buffer side of the push pipeline and
// the passes that aggregate a full buffer into the next version. The buffer's rules are in
// UpdateBuffer (update_buffer.h); this file locks, publishes and sends the events.

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_core_internal.h"
#include "services/aggregator/memory_budget.h"

namespace shoal::aggregator {

absl::Status AggregatorCore::OpenBuffer(const OpenBufferParams& p) {
  BufferSettings settings{p.async,        p.aggregation, p.max_update_norm,
                          p.last_version, p.parent,      {p.children.begin(), p.children.end()}};
  if (settings.forwards() && p.parent.child().empty()) {
    return absl::InvalidArgumentError("parent.child: required with parent.address");
  }
  absl::StatusOr<std::unique_ptr<UpdateBuffer>> made =
      UpdateBuffer::Create(p.task, std::move(settings), p.base_version, options_.fold_threads);
  if (!made.ok()) return made.status();
  std::shared_ptr<UpdateBuffer> fresh = *std::move(made);
  std::shared_ptr<UpdateBuffer> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(p.task);
  if (task == nullptr || task->versions.empty()) {
    return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(p.task)));
  }
  std::shared_ptr<UpdateBuffer>& current = task->buffer;
  // A repeat (e.g. a retry whose answer was lost) names the version the buffer opened on, or one
  // it has published since.
  if (current != nullptr && current->SameSettings(*fresh) &&
      p.base_version >= current->opened_on() && p.base_version <= task->latest) {
    current->Adjust(*fresh);  // the tree's peers changed: its updates stay
    task->children.insert(p.children.begin(), p.children.end());
    return absl::OkStatus();
  }
  if (task->round != nullptr && task->round->state == Round::State::kClosing) {
    return absl::AbortedError(absl::StrCat("round ", task->round->number, " of ", TaskLabel(p.task),
                                           " is still closing; retry"));
  }
  if (absl::Status base = CheckBaseIsLatest(*task, p.task, p.base_version); !base.ok()) {
    return base;
  }
  const uint64_t model_bytes = task->versions.at(task->latest).model->layout.total_bytes();
  if (absl::Status fits = CheckBufferMemory(fresh->strategy(), fresh->capacity(), model_bytes,
                                            options_.max_buffer_bytes,
                                            absl::StrCat("the buffer of ", TaskLabel(p.task)));
      !fits.ok()) {
    metrics_.max_buffer_refusals.Increment();
    return fits;
  }
  AbandonRound(*task);
  if (current != nullptr) {
    metrics_.buffered_updates.Decrement(static_cast<double>(current->size()));
    dropped = std::move(current);
  }
  current = std::move(fresh);
  task->children.insert(p.children.begin(), p.children.end());
  return absl::OkStatus();
}

std::shared_ptr<UpdateBuffer> AggregatorCore::ResetBuffer(Task& task) {
  if (task.buffer == nullptr) return nullptr;
  metrics_.buffered_updates.Decrement(static_cast<double>(task.buffer->size()));
  std::shared_ptr<UpdateBuffer> old = std::move(task.buffer);
  task.buffer = old->Reopen(task.latest);
  return old;
}

absl::Status AggregatorCore::TargetBuffer(Task& task, const PushMeta& meta, PushTarget& target) {
  std::shared_ptr<UpdateBuffer> buffer = task.buffer;
  if (!meta.replicated_by.empty()) {
    target.reason = RejectReason::kUnexpectedPeer;
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(meta.task), " has no round with backups here (a copy from '",
                     EscapeBytes(meta.replicated_by), "')"));
  }
  if (buffer == nullptr) {
    target.reason = RejectReason::kRoundNotOpen;
    return absl::FailedPreconditionError(
        absl::StrCat(TaskLabel(meta.task),
                     " has no federated-async buffer open (round 0 pushes go to a buffer)"));
  }
  UpdateBuffer::Admission admission = buffer->Admit(meta.peer_id, meta.base_version, task.latest);
  if (admission.refusal.has_value()) {
    target.reason = admission.refusal->reason;
    return admission.refusal->status;
  }
  if (buffer->pushing().count(meta.peer_id) > 0) {
    target.reason = RejectReason::kBusy;
    return absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                           "' into the buffer of ", TaskLabel(meta.task),
                                           " is already in progress"));
  }
  target.model = task.versions.at(task.latest).model;
  target.max_norm = buffer->settings().max_update_norm;
  target.buffer = std::move(buffer);
  return absl::OkStatus();
}

absl::Status AggregatorCore::AcceptBufferPush(Push& push) {
  UpdateBuffer& buffer = *push.buffer_;
  uint64_t staleness = 0;
  std::optional<UpdateBuffer::Update> replaced;  // its delta is freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    Task& task = *push.task_;
    if (task.released || task.buffer != push.buffer_) {
      return push.RejectWith(
          RejectReason::kRoundNotOpen,
          absl::FailedPreconditionError(absl::StrCat("the buffer of ", TaskLabel(push.meta_.task),
                                                     " was reset or released before the update "
                                                     "was complete")));
    }
    // Checked again: versions may have been published while the update streamed in.
    UpdateBuffer::Admission admission =
        buffer.Admit(push.meta_.peer_id, push.meta_.base_version, task.latest);
    if (admission.refusal.has_value()) {
      return push.RejectWith(admission.refusal->reason, admission.refusal->status);
    }
    staleness = admission.staleness;
    UpdateBuffer::Update update;
    update.peer = push.meta_.peer_id;
    update.base_version = push.meta_.base_version;
    update.staleness = staleness;
    update.num_samples = push.meta_.num_samples;
    update.train_loss = push.meta_.train_loss;
    update.sum_squares = push.sum_squares_;
    if (buffer.Repeats(update)) {
      push.done_ = true;
      push.duplicate_ = true;
      return absl::OkStatus();
    }
    update.delta = std::move(push.values_);
    replaced = buffer.Put(std::move(update));
    if (!replaced.has_value()) metrics_.buffered_updates.Increment();
    push.fold_pending_ = buffer.ClaimPass();
  }
  push.done_ = true;
  metrics_.updates_accepted.Increment();
  metrics_.update_staleness.Observe(static_cast<double>(staleness));
  NotifyAccepted(push);
  return absl::OkStatus();
}

void AggregatorCore::RunBufferPasses(const std::shared_ptr<Task>& task,
                                     const std::shared_ptr<UpdateBuffer>& buffer) {
  for (;;) {
    std::vector<UpdateBuffer::Update> updates;
    std::shared_ptr<const tensor::FlatModel> base;
    uint64_t base_version = 0;
    std::unique_ptr<RoundAggregation> aggregation;
    auto next = std::make_shared<tensor::FlatModel>();
    {
      absl::MutexLock lock(&mu_);
      // A reset or released buffer is no longer the task's: its updates are dropped.
      if (task->released || task->buffer != buffer) return;
      std::optional<std::vector<UpdateBuffer::Update>> taken = buffer->TakeFullPass();
      if (!taken.has_value()) return;  // not full: this runner's turn ends
      updates = *std::move(taken);
      metrics_.buffered_updates.Decrement(static_cast<double>(updates.size()));
      base_version = task->latest;
      base = task->versions.at(base_version).model;
      if (buffer->settings().forwards()) {
        // A tree node's updates may have waited across versions fetched from its parent: the
        // aggregate is against the latest, so each is as stale as it is now.
        for (UpdateBuffer::Update& u : updates) {
          if (!u.merged && base_version > u.base_version) {
            u.staleness = std::max(u.staleness, base_version - u.base_version);
          }
        }
      }
      next->layout = base->layout;
      next->values = TakeEvictedBuffer(*task, base_version, base->layout);
      aggregation = buffer->TakeAggregation(base->layout);
    }

    // The pass over the model, without the lock. Each update's buffer goes back to the staging
    // pool once it is folded in (mean) or copied (the others).
    const bool streaming = aggregation->streaming();
    absl::StatusOr<UpdateBuffer::PassResult> result =
        UpdateBuffer::RunPass(updates, *aggregation, buffer->settings().async, *base, next->values,
                              [this, &buffer, streaming](UpdateBuffer::Update& update) {
                                std::vector<float> spare;
                                absl::MutexLock lock(&mu_);
                                if (streaming) buffer->Folded();
                                spare = RecycleBuffer(std::move(update.delta));
                              });
    uint64_t digest = 0;  // of a version this node publishes
    if (result.ok() && !buffer->settings().forwards()) digest = next->Digest();

    if (buffer->settings().forwards()) {
      // A tree's node below the root: the aggregate goes to the parent as one update; the
      // node's versions come from there.
      PartialResult aggregate;
      {
        absl::MutexLock lock(&mu_);
        if (task->released || task->buffer != buffer) return;
        buffer->PassDone();
        if (result.ok()) buffer->KeepAggregation(std::move(aggregation));
      }
      if (!result.ok()) {
        LogError("the buffer of ", TaskLabel(task->name), " lost ", updates.size(),
                 " updates aggregating on version ", base_version, ": ",
                 result.status().ToString());
        continue;
      }
      aggregate.meta.task = task->name;
      aggregate.meta.base_version = base_version;
      aggregate.meta.contributors = std::move(result->contributors);
      aggregate.meta.num_samples = result->num_samples;
      aggregate.meta.loss_sum = result->mean_train_loss * static_cast<double>(result->num_samples);
      for (size_t i = 0; i < next->values.size(); ++i) next->values[i] -= base->values[i];
      aggregate.sum.sum = std::move(next->values);
      aggregate.sum.count = aggregate.meta.contributors.size();
      aggregate.sum.total_weight = 1;
      ForwardAggregate(buffer->settings().parent, aggregate);
      std::vector<float> spare;
      absl::MutexLock lock(&mu_);
      spare = RecycleBuffer(std::move(aggregate.sum.sum));
      continue;
    }

    v1::TaskEvent event;
    {
      absl::MutexLock lock(&mu_);
      if (task->released || task->buffer != buffer) return;  // a restore superseded this version
      buffer->PassDone();
      if (!result.ok()) {
        // Cannot happen for validated updates (an invariant broke). Nobody is waiting for this
        // pass to answer, so it is reported here; the next full buffer is aggregated as usual.
        LogError("the buffer of ", TaskLabel(task->name), " lost ", updates.size(),
                 " updates aggregating version ", base_version + 1, ": ",
                 result.status().ToString());
        continue;
      }
      const uint64_t version = base_version + 1;
      PublishVersion(*task, version, std::move(next), digest);
      if (!buffer->Finished(version)) buffer->KeepAggregation(std::move(aggregation));
      metrics_.versions_published.Increment();
      v1::VersionPublished& published = *event.mutable_version_published();
      published.set_version(version);
      for (const std::string& peer : result->contributors) published.add_contributors(peer);
      published.set_num_samples(result->num_samples);
      published.set_mean_train_loss(result->mean_train_loss);
      published.set_digest_xxh3(digest);
      published.set_mean_staleness(result->mean_staleness);
      published.set_note(result->report.note);
      published.set_published_unix_ms(absl::ToUnixMillis(clock_.Now()));
    }
    Notify(task->name, event);
  }
}

void AggregatorCore::ForwardAggregate(const v1::ParentRound& parent,
                                      const PartialResult& aggregate) {
  // A parent that is busy or briefly away gets the aggregate again, a few times.
  constexpr int kAttempts = 3;
  absl::Status sent = absl::FailedPreconditionError("no forwarder is set");
  for (int attempt = 1; forward_ != nullptr; ++attempt) {
    sent = forward_(parent, aggregate);
    if (sent.ok() || attempt == kAttempts ||
        (!absl::IsUnavailable(sent) && !absl::IsResourceExhausted(sent) &&
         !absl::IsDeadlineExceeded(sent) && !absl::IsAborted(sent))) {
      break;
    }
    absl::SleepFor(absl::Seconds(attempt));
  }
  if (sent.ok()) {
    metrics_.partials_forwarded.Increment();
    return;
  }
  metrics_.partials_lost.Increment();
  LogWarning("the buffer of ", TaskLabel(aggregate.meta.task), ": the aggregate of ",
             aggregate.meta.contributors.size(), " peers' updates on version ",
             aggregate.meta.base_version, " did not reach the parent ", parent.address(), ": ",
             sent.message());
}

absl::StatusOr<bool> AggregatorCore::AddBufferPartial(const PartialMeta& meta,
                                                      const aggregation::PartialSum& aggregate) {
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
      metrics_.RejectedCounter(RejectReason::kNonFinite).Increment();
      return absl::InvalidArgumentError(absl::StrCat(child, "'s aggregate has a non-finite value"));
    }
    sum_squares += static_cast<double>(v) * v;
  }
  std::shared_ptr<Task> task;
  std::shared_ptr<UpdateBuffer> buffer;
  bool run_pass = false;
  {
    absl::MutexLock lock(&mu_);
    task = FindTask(meta.task);
    if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(meta.task)));
    buffer = task->buffer;
    if (buffer == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(TaskLabel(meta.task), " has no federated-async buffer open"));
    }
    if (buffer->settings().children.count(meta.child) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(child, " is not a child of the buffer of ", TaskLabel(meta.task)));
    }
    const size_t values = task->versions.at(task->latest).model->layout.total_elements();
    if (aggregate.sum.size() != values) {
      return absl::InvalidArgumentError(absl::StrCat(
          child, "'s aggregate has ", aggregate.sum.size(), " values; the model has ", values));
    }
    UpdateBuffer::Admission admission = buffer->Admit(meta.child, meta.base_version, task->latest);
    if (admission.refusal.has_value()) return admission.refusal->status;
    UpdateBuffer::Update update;
    update.peer = meta.child;
    update.base_version = meta.base_version;
    update.staleness = admission.staleness;
    update.num_samples = meta.num_samples;
    update.train_loss = meta.loss_sum / static_cast<double>(meta.num_samples);
    update.sum_squares = sum_squares;
    update.contributors = meta.contributors;
    if (buffer->Repeats(update)) return true;
    update.delta = aggregate.sum;
    if (!buffer->Merge(update) && !buffer->Put(std::move(update)).has_value()) {
      metrics_.buffered_updates.Increment();
    }
    run_pass = buffer->ClaimPass();
    metrics_.update_staleness.Observe(static_cast<double>(admission.staleness));
  }
  metrics_.partials_accepted.Increment();
  if (run_pass) RunBufferPasses(task, buffer);
  return false;
}

}  // namespace shoal::aggregator
