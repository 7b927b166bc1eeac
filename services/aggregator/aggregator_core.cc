// AggregatorCore: options, models, members, watches, staging and the push pipeline. Rounds are
// in aggregator_rounds.cc, the federated-async buffer in aggregator_buffer.cc.

#include "services/aggregator/aggregator_core.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/aggregation/update_validation.h"
#include "libs/common/escape.h"
#include "services/aggregator/aggregator_core_internal.h"

namespace shoal::aggregator {

std::string TaskLabel(const std::string& task) {
  return absl::StrCat("task '", EscapeBytes(task), "'");
}

absl::Status CheckBaseIsLatest(const AggregatorCore::Task& task, const std::string& name,
                               uint64_t base_version) {
  if (task.versions.count(base_version) == 0) {
    return absl::FailedPreconditionError(absl::StrCat("base version ", base_version, " of ",
                                                      TaskLabel(name), " is not held (latest is ",
                                                      task.latest, ")"));
  }
  if (base_version != task.latest) {
    return absl::FailedPreconditionError(absl::StrCat("base version ", base_version, " of ",
                                                      TaskLabel(name), " is not the latest (",
                                                      task.latest, ")"));
  }
  return absl::OkStatus();
}

PushMeta PushMeta::From(const v1::UpdateMeta& m, std::string caller_identity) {
  PushMeta meta{m.task(),        m.round(),      m.peer_id(),       m.base_version(),
                m.num_samples(), m.train_loss(), m.session_token(), std::move(caller_identity)};
  meta.train_ms = m.train_ms();
  meta.replicated_by = m.replicated_by();
  return meta;
}

v1::UpdateMeta PushMeta::ToProto() const {
  v1::UpdateMeta m;
  m.set_task(task);
  m.set_round(round);
  m.set_peer_id(peer_id);
  m.set_base_version(base_version);
  m.set_num_samples(num_samples);
  m.set_train_loss(train_loss);
  m.set_session_token(session_token);
  m.set_train_ms(train_ms);
  m.set_replicated_by(replicated_by);
  return m;
}

OpenRoundParams OpenRoundParams::From(const v1::OpenRoundRequest& request) {
  OpenRoundParams params;
  params.task = request.task();
  params.round = request.round();
  params.base_version = request.base_version();
  params.expected_peers.assign(request.expected_peers().begin(), request.expected_peers().end());
  params.max_update_norm = request.max_update_norm();
  params.aggregation = request.aggregation();
  params.late_peers.assign(request.late_peers().begin(), request.late_peers().end());
  params.late_staleness = request.late_staleness();
  params.expected_children.assign(request.expected_children().begin(),
                                  request.expected_children().end());
  params.parent = request.parent();
  params.backups.assign(request.backups().begin(), request.backups().end());
  params.standby_for = request.standby_for();
  params.replica_id = request.replica_id();
  for (const v1::ChildBackup& b : request.child_backups()) {
    params.child_backups.emplace_back(b.child(), b.backup());
  }
  params.dp = request.dp();
  return params;
}

OpenBufferParams OpenBufferParams::From(const v1::OpenBufferRequest& request) {
  OpenBufferParams params;
  params.task = request.task();
  params.base_version = request.base_version();
  params.async = request.async();
  params.aggregation = request.aggregation();
  params.max_update_norm = request.max_update_norm();
  params.last_version = request.last_version();
  params.parent = request.parent();
  params.children.assign(request.children().begin(), request.children().end());
  return params;
}

v1::CloseRoundResponse RoundResult::ToProto() const {
  v1::CloseRoundResponse response;
  response.set_version(version);
  for (const auto& peer : contributors) response.add_contributors(peer);
  response.set_num_samples(num_samples);
  response.set_mean_train_loss(mean_train_loss);
  response.set_digest_xxh3(digest);
  response.set_note(note);
  response.set_model_bytes(model_bytes);
  return response;
}

absl::Status AggregatorCoreOptions::Validate() const {
  if (max_concurrent_pushes < 1 || max_concurrent_pushes > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_pushes must be in [1, 1024], got ", max_concurrent_pushes));
  }
  if (versions_kept < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("versions_kept must be >= 2, got ", versions_kept));
  }
  if (fold_threads < 1 || fold_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("fold_threads must be in [1, 64], got ", fold_threads));
  }
  if (closed_rounds_kept < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("closed_rounds_kept must be >= 1, got ", closed_rounds_kept));
  }
  if (max_buffer_bytes < 1) return absl::InvalidArgumentError("max_buffer_bytes must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AggregatorCore>> AggregatorCore::Create(
    AggregatorCoreOptions options, const Clock& clock, AggregatorMetrics& metrics) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  return std::unique_ptr<AggregatorCore>(new AggregatorCore(std::move(options), clock, metrics));
}

AggregatorCore::AggregatorCore(AggregatorCoreOptions options, const Clock& clock,
                               AggregatorMetrics& metrics)
    : options_(std::move(options)), clock_(clock), metrics_(metrics) {}

AggregatorCore::~AggregatorCore() {
  {
    // The watch streams are done by now (their server has shut down): their last Unwatch is
    // ordered before this by gRPC's own atomics, which ThreadSanitizer does not see; the lock
    // shows it.
    absl::MutexLock lock(&watch_mu_);
    watchers_.clear();
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [name, task] : tasks_) {
    if (task->buffer != nullptr) {
      metrics_.buffered_updates.Decrement(static_cast<double>(task->buffer->size()));
    }
  }
}

std::shared_ptr<AggregatorCore::Task> AggregatorCore::FindTask(const std::string& task) const {
  auto it = tasks_.find(task);
  return it == tasks_.end() ? nullptr : it->second;
}

void AggregatorCore::EvictOldVersions(Task& task) {
  while (task.versions.size() > static_cast<size_t>(options_.versions_kept)) {
    task.versions.erase(task.versions.begin());
  }
}

void AggregatorCore::AbandonRound(Task& task) {
  if (task.round && task.round->state == Round::State::kOpen) {
    task.round->state = Round::State::kAbandoned;
  }
}

std::vector<float> AggregatorCore::TakeEvictedBuffer(Task& task, uint64_t keep,
                                                     const tensor::ModelLayout& layout) {
  if (task.versions.size() < static_cast<size_t>(options_.versions_kept)) return {};
  auto oldest = task.versions.begin();
  if (oldest->first == keep || oldest->second.model.use_count() != 1 ||
      !(oldest->second.model->layout == layout)) {
    return {};
  }
  // Held as const, created mutable (PutModel and the publishers make them).
  std::vector<float> values =
      std::move(const_cast<tensor::FlatModel&>(*oldest->second.model).values);
  task.versions.erase(oldest);
  return values;
}

void AggregatorCore::PublishVersion(Task& task, uint64_t version,
                                    std::shared_ptr<const tensor::FlatModel> model,
                                    uint64_t digest) {
  task.versions[version] = Task::Version{std::move(model), digest};
  task.latest = version;
  EvictOldVersions(task);
  metrics_.model_version.Set(static_cast<double>(version));
}

// ---------------------------------------------------------------------------------------------
// Models

absl::StatusOr<PutResult> AggregatorCore::PutModel(const std::string& name, uint64_t version,
                                                   tensor::FlatModel model) {
  if (name.empty()) return absl::InvalidArgumentError("ModelMeta.task is empty");
  if (model.values.size() != model.layout.total_elements()) {
    return absl::InvalidArgumentError("model values do not match its layout");
  }
  const uint64_t digest = model.Digest();
  // Held as const, created mutable: publishing may recycle an evicted version's buffer.
  std::shared_ptr<const tensor::FlatModel> shared =
      std::make_shared<tensor::FlatModel>(std::move(model));
  std::shared_ptr<UpdateBuffer> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Task>& task = tasks_[name];
  if (task == nullptr) {
    task = std::make_shared<Task>();
    task->name = name;
  }
  if (!task->versions.empty()) {
    if (version < task->latest) {
      return absl::FailedPreconditionError(absl::StrCat(TaskLabel(name), " already holds version ",
                                                        task->latest, ", newer than ", version));
    }
    if (version == task->latest) {
      const Task::Version& held = task->versions.at(version);
      if (held.digest == digest && held.model->layout == shared->layout) {
        return PutResult{version, digest};
      }
      return absl::FailedPreconditionError(absl::StrCat(TaskLabel(name), " already holds version ",
                                                        version, " with different contents"));
    }
  }
  PublishVersion(*task, version, std::move(shared), digest);
  AbandonRound(*task);
  // A tree node's buffer takes its versions from its parent: its updates stay, now staler.
  if (task->buffer == nullptr || !task->buffer->settings().forwards()) dropped = ResetBuffer(*task);
  return PutResult{version, digest};
}

absl::StatusOr<ModelSnapshot> AggregatorCore::GetModel(const std::string& name,
                                                       std::optional<uint64_t> version) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(name);
  if (task == nullptr || task->versions.empty()) {
    return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
  }
  const uint64_t want = version.value_or(task->latest);
  auto it = task->versions.find(want);
  if (it == task->versions.end()) {
    std::vector<uint64_t> held;
    for (const auto& [v, _] : task->versions) held.push_back(v);
    return absl::NotFoundError(absl::StrCat("version ", want, " of ", TaskLabel(name),
                                            " is not held (held: ", absl::StrJoin(held, ", "),
                                            ")"));
  }
  return ModelSnapshot{want, it->second.model};
}

void AggregatorCore::SetMembers(const std::string& task,
                                std::map<std::string, std::string> session_tokens) {
  absl::MutexLock lock(&mu_);
  members_[task] = std::move(session_tokens);
}

absl::Status AggregatorCore::CheckCaller(const std::string& task, const std::string& peer_id,
                                         const std::string& session_token,
                                         const std::string& identity) const {
  if (peer_id.empty()) {
    if (identity.empty() || identity == "coordinator") return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("certificate '", EscapeBytes(identity),
                     "' must name its peer id (only the coordinator may not)"));
  }
  if (!identity.empty() && identity != peer_id) {
    return absl::PermissionDeniedError(absl::StrCat("the caller's certificate is for '",
                                                    EscapeBytes(identity), "', not for peer '",
                                                    EscapeBytes(peer_id), "'"));
  }
  absl::MutexLock lock(&mu_);
  auto members = members_.find(task);
  if (members == members_.end()) return absl::OkStatus();  // not set yet (plaintext tests)
  auto token = members->second.find(peer_id);
  if (token == members->second.end() || session_token.empty() || token->second != session_token) {
    return absl::UnauthenticatedError(absl::StrCat("missing or wrong session token for peer '",
                                                   EscapeBytes(peer_id), "' of ", TaskLabel(task)));
  }
  return absl::OkStatus();
}

absl::Status AggregatorCore::CheckReader(const std::string& task, const std::string& peer_id,
                                         const std::string& session_token,
                                         const std::string& identity) const {
  if (!peer_id.empty() && CheckChildCaller(task, peer_id, identity).ok()) {
    absl::ReaderMutexLock lock(&mu_);
    std::shared_ptr<Task> t = FindTask(task);
    if (t != nullptr && t->children.count(peer_id) > 0) return absl::OkStatus();
  }
  return CheckCaller(task, peer_id, session_token, identity);
}

uint64_t AggregatorCore::Watch(const std::string& name, TaskEventFn on_event) {
  v1::TaskEvent event;
  v1::WatchStarted& started = *event.mutable_started();
  // The snapshot and the registration happen under mu_ together: an update accepted (or a
  // version published) before them is in the snapshot (and maybe delivered again, harmlessly),
  // one after them is delivered, since events are sent only after mu_ is released.
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(name);
  if (task != nullptr && !task->versions.empty()) {
    started.set_has_model(true);
    started.set_latest_version(task->latest);
    if (task->buffer != nullptr) {
      for (const std::string& peer : task->buffer->Pending()) started.add_accepted(peer);
    } else if (task->round != nullptr && task->round->state == Round::State::kOpen) {
      started.set_open_round(task->round->number);
      for (const std::string& peer : task->round->accepted) started.add_accepted(peer);
    }
  }
  absl::MutexLock watch_lock(&watch_mu_);
  const uint64_t handle = next_watch_++;
  on_event(event);  // before the registration: nothing reaches the watcher ahead of it
  watchers_[handle] = {name, std::make_shared<const TaskEventFn>(std::move(on_event))};
  return handle;
}

void AggregatorCore::Unwatch(uint64_t handle) {
  absl::MutexLock lock(&watch_mu_);
  watchers_.erase(handle);
}

void AggregatorCore::Notify(const std::string& task, const v1::TaskEvent& event) {
  std::vector<std::shared_ptr<const TaskEventFn>> targets;
  {
    absl::MutexLock lock(&watch_mu_);
    for (const auto& [handle, watcher] : watchers_) {
      if (watcher.first == task) targets.push_back(watcher.second);
    }
  }
  for (const auto& fn : targets) (*fn)(event);
}

void AggregatorCore::NotifyAccepted(const Push& push) {
  v1::TaskEvent event;
  v1::PushAccepted& accepted = *event.mutable_push_accepted();
  // A late update went into the round open when it arrived.
  accepted.set_round(push.round_ != nullptr ? push.round_->number : push.meta_.round);
  accepted.set_peer_id(push.meta_.peer_id);
  accepted.set_base_version(push.meta_.base_version);
  accepted.set_num_samples(push.meta_.num_samples);
  accepted.set_train_ms(push.meta_.train_ms);
  accepted.set_update_bytes(push.bytes_received());
  Notify(push.meta_.task, event);
}

void AggregatorCore::ReleaseTask(const std::string& name) {
  std::shared_ptr<Task> task;
  {
    absl::MutexLock lock(&mu_);
    members_.erase(name);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) return;
    task = std::move(it->second);
    tasks_.erase(it);
    task->released = true;
    AbandonRound(*task);
    if (task->buffer != nullptr) {
      metrics_.buffered_updates.Decrement(static_cast<double>(task->buffer->size()));
    }
  }
  // `task` (its models and buffer) is freed here, outside the lock, unless a push still holds it.
}

// ---------------------------------------------------------------------------------------------
// Staging and pushes

AggregatorCore::StagingLease::~StagingLease() {
  if (core_ != nullptr) core_->ReleaseStaging({});
}

absl::StatusOr<AggregatorCore::StagingLease> AggregatorCore::AcquireStaging() {
  absl::MutexLock lock(&mu_);
  if (leases_ >= options_.max_concurrent_pushes) {
    return absl::ResourceExhaustedError(absl::StrCat("all ", options_.max_concurrent_pushes,
                                                     " staging slots are busy; retry later"));
  }
  ++leases_;
  metrics_.pushes_in_flight.Set(leases_);
  return StagingLease(this);
}

void AggregatorCore::ReleaseStaging(std::vector<float> buffer) {
  absl::MutexLock lock(&mu_);
  --leases_;
  metrics_.pushes_in_flight.Set(leases_);
  // A buffer the pool does not take is freed when the parameter dies, after the unlock.
  buffer = RecycleBuffer(std::move(buffer));
}

std::vector<float> AggregatorCore::RecycleBuffer(std::vector<float> buffer) {
  if (buffer.capacity() > 0 &&
      free_buffers_.size() < static_cast<size_t>(options_.max_concurrent_pushes)) {
    free_buffers_.push_back(std::move(buffer));
    return {};
  }
  return buffer;
}

absl::StatusOr<std::unique_ptr<AggregatorCore::Push>> AggregatorCore::BeginPush(
    const PushMeta& meta) {
  auto reject = [this](RejectReason reason, absl::Status status) {
    metrics_.RejectedCounter(reason).Increment();
    return status;
  };
  if (meta.peer_id.empty()) {
    return reject(RejectReason::kMalformed,
                  absl::InvalidArgumentError("UpdateMeta.peer_id is empty"));
  }
  if (meta.num_samples == 0) {
    return reject(RejectReason::kMalformed,
                  absl::InvalidArgumentError("UpdateMeta.num_samples must be >= 1"));
  }
  if (!std::isfinite(meta.train_loss)) {
    return reject(RejectReason::kNonFinite,
                  absl::InvalidArgumentError("UpdateMeta.train_loss is not finite"));
  }
  // A primary's copy of a peer's update comes with the primary's certificate and the peer's
  // token.
  const bool copy = !meta.replicated_by.empty();
  if (copy && !meta.caller_identity.empty() &&
      !IsChildOf(meta.caller_identity, meta.replicated_by)) {
    return reject(RejectReason::kUnauthenticated,
                  absl::PermissionDeniedError(absl::StrCat(
                      "the caller's certificate is for '", EscapeBytes(meta.caller_identity),
                      "', not for primary '", EscapeBytes(meta.replicated_by), "'")));
  }
  if (absl::Status s = CheckCaller(meta.task, meta.peer_id, meta.session_token,
                                   copy ? std::string() : meta.caller_identity);
      !s.ok()) {
    return reject(RejectReason::kUnauthenticated, s);
  }
  std::shared_ptr<Task> task;
  PushTarget target;
  std::vector<float> buffer;
  {
    absl::MutexLock lock(&mu_);
    task = FindTask(meta.task);
    if (task == nullptr) {
      return reject(RejectReason::kUnknownTask,
                    absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(meta.task))));
    }
    absl::Status s =
        meta.round == 0 ? TargetBuffer(*task, meta, target) : TargetRound(*task, meta, target);
    if (!s.ok()) return reject(target.reason, s);
    if (target.duplicate) return std::unique_ptr<Push>();
    if (leases_ >= options_.max_concurrent_pushes) {
      return reject(RejectReason::kBusy, absl::ResourceExhaustedError(absl::StrCat(
                                             "all ", options_.max_concurrent_pushes,
                                             " staging buffers are busy; retry later")));
    }
    ++leases_;
    metrics_.pushes_in_flight.Set(leases_);
    if (!free_buffers_.empty()) {
      buffer = std::move(free_buffers_.back());
      free_buffers_.pop_back();
    }
    if (target.round != nullptr) {
      target.round->pushing.insert(meta.peer_id);
    } else {
      target.buffer->pushing().insert(meta.peer_id);
    }
  }
  // Decoding into a pooled buffer of the right size touches no fresh memory.
  tensor::FrameDecoder decoder = tensor::FrameDecoder::ForLayout(
      target.model->layout, /*require_finite=*/true, std::move(buffer));
  return std::unique_ptr<Push>(new Push(this, std::move(task), std::move(target.round),
                                        std::move(target.buffer), meta, std::move(decoder),
                                        target.max_norm, target.staleness_factor));
}

AggregatorCore::Push::Push(AggregatorCore* core, std::shared_ptr<Task> task,
                           std::shared_ptr<Round> round, std::shared_ptr<UpdateBuffer> buffer,
                           PushMeta meta, tensor::FrameDecoder decoder, double max_norm,
                           double staleness_factor)
    : core_(core),
      task_(std::move(task)),
      round_(std::move(round)),
      buffer_(std::move(buffer)),
      meta_(std::move(meta)),
      decoder_(std::move(decoder)),
      max_norm_(max_norm),
      staleness_factor_(staleness_factor) {}

AggregatorCore::Push::~Push() {
  if (!done_) Reject(RejectReason::kIncomplete);
  // An accepted update was (or may have been) acknowledged: it must reach the aggregate, and
  // CloseRound waits for its folds_in_flight count.
  if (fold_pending_) Fold();
  std::vector<float> values =
      values_.capacity() > 0 ? std::move(values_) : std::move(decoder_).ReleaseBuffer();
  {
    absl::MutexLock lock(&core_->mu_);
    if (round_ != nullptr) {
      round_->pushing.erase(meta_.peer_id);
    } else {
      buffer_->pushing().erase(meta_.peer_id);
    }
  }
  core_->ReleaseStaging(std::move(values));
}

void AggregatorCore::Push::Reject(RejectReason reason) {
  if (done_) return;
  done_ = true;
  core_->metrics_.RejectedCounter(reason).Increment();
}

absl::Status AggregatorCore::Push::RejectWith(RejectReason reason, absl::Status status) {
  Reject(reason);
  return status;
}

absl::Status AggregatorCore::Push::AddFrame(const common::v1::TensorFrame& frame) {
  absl::Status s = decoder_.Add(frame);
  if (!s.ok() && !done_) {
    Reject(decoder_.failed_non_finite() ? RejectReason::kNonFinite : RejectReason::kMalformed);
  }
  return s;
}

absl::Status AggregatorCore::Push::AddChunkParts(absl::Span<const absl::string_view> parts) {
  absl::Status s = decoder_.AddChunkParts(parts);
  if (!s.ok() && !done_) {
    Reject(decoder_.failed_non_finite() ? RejectReason::kNonFinite : RejectReason::kMalformed);
  }
  return s;
}

absl::Status AggregatorCore::Push::Accept() {
  if (done_) return absl::FailedPreconditionError("push already finished");
  sum_squares_ = decoder_.sum_squares();
  auto model = std::move(decoder_).Finish();
  if (!model.ok()) return RejectWith(RejectReason::kIncomplete, model.status());
  values_ = std::move(model->values);
  absl::Status s = aggregation::CheckNormBound(std::sqrt(sum_squares_), max_norm_);
  if (!s.ok()) return RejectWith(RejectReason::kNormBound, s);
  return round_ != nullptr ? core_->AcceptRoundPush(*this) : core_->AcceptBufferPush(*this);
}

void AggregatorCore::Push::Fold() {
  if (!fold_pending_) return;
  if (round_ != nullptr) {
    core_->FoldRoundPush(*this);
  } else {
    fold_pending_ = false;
    core_->RunBufferPasses(task_, buffer_);
  }
}

absl::Status AggregatorCore::Push::Commit() {
  absl::Status s = Accept();
  if (s.ok()) Fold();
  return s;
}

}  // namespace shoal::aggregator
