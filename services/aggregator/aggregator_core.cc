// AggregatorCore: models, members, watches, staging and the push pipeline; whatever concerns
// aggregating goes to the task's session (sessions/).

#include "services/aggregator/aggregator_core.h"

#include <cmath>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/aggregation/update_validation.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"

namespace shoal::aggregator {

absl::StatusOr<std::unique_ptr<AggregatorCore>> AggregatorCore::Create(
    AggregatorCoreOptions options, const Clock& clock, AggregatorMetrics& metrics) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  return std::unique_ptr<AggregatorCore>(new AggregatorCore(std::move(options), clock, metrics));
}

AggregatorCore::AggregatorCore(AggregatorCoreOptions options, const Clock& clock,
                               AggregatorMetrics& metrics)
    : SessionHost(std::move(options), clock, metrics),
      staging_buffers_(
          tensor::BufferPool::Create(static_cast<size_t>(options_.max_concurrent_pushes))),
      forwarder_(std::make_unique<ParentForwarder>(
          metrics, [this](std::vector<float> buffer) { RecycleBuffer(std::move(buffer)); })) {}

AggregatorCore::~AggregatorCore() {
  forwarder_.reset();  // sends what is queued, then joins
  {
    // The watch streams are done by now (their server has shut down): their last Unwatch is
    // ordered before this by gRPC's own atomics, which ThreadSanitizer does not see; the lock
    // shows it.
    absl::MutexLock lock(&watch_mu_);
    watchers_.clear();
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [name, task] : tasks_) {
    if (task->session != nullptr) task->session->Abandon();
  }
}

namespace {

// What a request about a task with no session yet is answered.
absl::Status NotOpen(uint64_t round, const std::string& task) {
  return absl::NotFoundError(absl::StrCat(RoundLabel(round, task), " is not open"));
}
absl::Status NothingOpen(const std::string& task) {
  return absl::FailedPreconditionError(
      absl::StrCat(TaskLabel(task), " has no round or federated-async buffer open"));
}

ModelSnapshot Snapshot(uint64_t version, const TaskState::Version& held) {
  return ModelSnapshot{version, held.model, held.tensor_digests};
}

}  // namespace

std::shared_ptr<TaskState> AggregatorCore::FindTask(const std::string& task) const {
  auto it = tasks_.find(task);
  return it == tasks_.end() ? nullptr : it->second;
}

absl::Status AggregatorCore::FindSession(const std::string& name, std::shared_ptr<TaskState>& task,
                                         std::shared_ptr<AggregationSession>& session,
                                         absl::Status none) const {
  absl::ReaderMutexLock lock(&mu_);
  task = FindTask(name);
  if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
  session = task->session;
  return session == nullptr ? none : absl::OkStatus();
}

void AggregatorCore::EvictOldVersions(TaskState& task) {
  while (task.versions.size() > static_cast<size_t>(options_.versions_kept)) {
    auto oldest = task.versions.begin();
    // A buffer nobody else holds goes to the staging pool (a push reuses it without the
    // first-touch cost of a fresh one).
    if (oldest->second.model.use_count() == 1) {
      RecycleBuffer(std::move(const_cast<tensor::FlatModel&>(*oldest->second.model).values));
    }
    task.versions.erase(oldest);
  }
}

std::vector<float> AggregatorCore::TakeEvictedBuffer(TaskState& task, uint64_t keep,
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

void AggregatorCore::PublishVersion(TaskState& task, uint64_t version,
                                    std::shared_ptr<const tensor::FlatModel> model,
                                    uint64_t digest) {
  TaskState::Version& held = task.versions[version];
  held.model = std::move(model);
  held.digest = digest;
  held.tensor_digests = std::make_shared<tensor::TensorDigests>();
  task.latest = version;
  EvictOldVersions(task);
  metrics_.model_version.Set(static_cast<double>(version));
  auto published = task.versions.find(version);
  if (on_published_ && published != task.versions.begin()) {
    auto previous = std::prev(published);
    on_published_(task.name, Snapshot(version, published->second),
                  Snapshot(previous->first, previous->second));
  }
}

void AggregatorCore::SetOnPublished(PublishedFn on_published) {
  absl::MutexLock lock(&mu_);
  on_published_ = std::move(on_published);
}

// ---------------------------------------------------------------------------------------------
// Models

absl::StatusOr<PutResult> AggregatorCore::PutModel(const std::string& name, uint64_t version,
                                                   tensor::FlatModel model) {
  if (name.empty()) return absl::InvalidArgumentError("ModelMeta.task is empty");
  if (model.values.size() != model.layout.total_elements()) {
    return absl::InvalidArgumentError("model values do not match its layout");
  }
  calls_.Record(name);
  const uint64_t digest = model.Digest();
  // Held as const, created mutable: publishing may recycle an evicted version's buffer.
  std::shared_ptr<const tensor::FlatModel> shared =
      std::make_shared<tensor::FlatModel>(std::move(model));
  std::shared_ptr<AggregationSession> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  std::shared_ptr<TaskState>& task = tasks_[name];
  if (task == nullptr) {
    task = std::make_shared<TaskState>();
    task->name = name;
    metrics_.tasks_held.Set(static_cast<double>(tasks_.size()));
  }
  if (!task->versions.empty()) {
    if (version < task->latest) {
      return absl::FailedPreconditionError(absl::StrCat(TaskLabel(name), " already holds version ",
                                                        task->latest, ", newer than ", version));
    }
    if (version == task->latest) {
      const TaskState::Version& held = task->versions.at(version);
      if (held.digest == digest && held.model->layout == shared->layout) {
        return PutResult{version, digest};
      }
      return absl::FailedPreconditionError(absl::StrCat(TaskLabel(name), " already holds version ",
                                                        version, " with different contents"));
    }
  }
  PublishVersion(*task, version, std::move(shared), digest);
  if (task->session != nullptr) {
    std::shared_ptr<AggregationSession> next = task->session->OnNewVersion(*task);
    if (next != task->session) dropped = std::exchange(task->session, std::move(next));
  }
  return PutResult{version, digest};
}

absl::StatusOr<ModelSnapshot> AggregatorCore::GetModel(const std::string& name,
                                                       std::optional<uint64_t> version) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<TaskState> task = FindTask(name);
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
  return Snapshot(want, it->second);
}

// ---------------------------------------------------------------------------------------------
// Sessions

absl::Status AggregatorCore::OpenRound(const OpenRoundParams& params) {
  return Open(params.task, params);
}

absl::Status AggregatorCore::OpenBuffer(const OpenBufferParams& params) {
  return Open(params.task, params);
}

absl::Status AggregatorCore::Open(const std::string& name, const OpenRequest& request) {
  calls_.Record(name);
  absl::StatusOr<std::shared_ptr<AggregationSession>> made = MakeSession(request, *this);
  if (!made.ok()) return made.status();
  std::shared_ptr<AggregationSession> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  std::shared_ptr<TaskState> task = FindTask(name);
  if (task == nullptr || task->versions.empty()) {
    return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
  }
  absl::StatusOr<std::shared_ptr<AggregationSession>> opened = (*made)->Open(*task, task->session);
  if (!opened.ok()) return opened.status();
  if (*opened != task->session) {
    if (task->session != nullptr) task->session->Abandon();
    dropped = std::exchange(task->session, *std::move(opened));
  }
  return absl::OkStatus();
}

absl::StatusOr<RoundResult> AggregatorCore::CloseRound(const std::string& name, uint64_t round) {
  std::shared_ptr<TaskState> task;
  std::shared_ptr<AggregationSession> session;
  if (absl::Status s = FindSession(name, task, session, NotOpen(round, name)); !s.ok()) return s;
  return session->Close(*task, round);
}

absl::StatusOr<std::shared_ptr<SecureExchange>> AggregatorCore::SecureRound(const std::string& name,
                                                                            uint64_t round) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<TaskState> task = FindTask(name);
  if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
  if (task->session == nullptr) return NotOpen(round, name);
  return task->session->Secure(*task, round);
}

absl::StatusOr<bool> AggregatorCore::AddPartial(const PartialMeta& meta,
                                                const aggregation::PartialSum& partial) {
  std::shared_ptr<TaskState> task;
  std::shared_ptr<AggregationSession> session;
  if (absl::Status s = FindSession(meta.task, task, session, NothingOpen(meta.task)); !s.ok()) {
    return s;
  }
  return session->AddPartial(task, meta, partial);
}

absl::StatusOr<std::shared_ptr<const PartialResult>> AggregatorCore::ClosePartial(
    const std::string& name, uint64_t round) {
  std::shared_ptr<TaskState> task;
  std::shared_ptr<AggregationSession> session;
  if (absl::Status s = FindSession(name, task, session, NotOpen(round, name)); !s.ok()) return s;
  return session->ClosePartial(*task, round);
}

v1::ParentRound AggregatorCore::ParentOf(const std::string& name, uint64_t round) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<TaskState> task = FindTask(name);
  if (task == nullptr || task->session == nullptr) return {};
  return task->session->ParentOf(round);
}

absl::StatusOr<size_t> AggregatorCore::PartialValues(const std::string& name,
                                                     uint64_t round) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<TaskState> task = FindTask(name);
  if (task == nullptr) return absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(name)));
  if (task->session == nullptr) return NothingOpen(name);
  return task->session->PartialValues(*task, round);
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
  std::shared_ptr<TaskState> t = FindTask(task);
  if (t == nullptr) return s;
  auto backups = t->child_backups.find(child);
  if (backups == t->child_backups.end()) return s;
  for (const std::string& backup : backups->second) {
    if (IsChildOf(identity, backup)) return absl::OkStatus();
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Members and watches

void AggregatorCore::SetMembers(const std::string& task,
                                std::map<std::string, std::string> session_tokens) {
  calls_.Record(task);
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
    std::shared_ptr<TaskState> t = FindTask(task);
    if (t != nullptr && t->children.count(peer_id) > 0) return absl::OkStatus();
  }
  return CheckCaller(task, peer_id, session_token, identity);
}

uint64_t AggregatorCore::Watch(const std::string& name, TaskEventFn on_event) {
  calls_.Record(name);
  v1::TaskEvent event;
  v1::WatchStarted& started = *event.mutable_started();
  // The snapshot and the registration happen under mu_ together: an update accepted (or a
  // version published) before them is in the snapshot (and maybe delivered again, harmlessly),
  // one after them is delivered, since events are sent only after mu_ is released.
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<TaskState> task = FindTask(name);
  if (task != nullptr && !task->versions.empty()) {
    started.set_has_model(true);
    started.set_latest_version(task->latest);
    if (task->session != nullptr) task->session->Describe(started);
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

std::optional<uint64_t> AggregatorCore::ReleaseTask(const std::string& name) {
  std::optional<uint64_t> newest;
  calls_.Forget(name, [&] { newest = Forget(name); });
  return newest;
}

bool AggregatorCore::ReleaseUnlessCalledSince(const std::string& name, uint64_t as_of) {
  return calls_.ForgetUnlessCalledSince(name, as_of, [&] { Forget(name); });
}

std::optional<uint64_t> AggregatorCore::Forget(const std::string& name) {
  std::shared_ptr<TaskState> task;
  std::optional<uint64_t> newest;
  {
    absl::MutexLock lock(&mu_);
    members_.erase(name);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) return std::nullopt;
    task = std::move(it->second);
    if (!task->versions.empty()) newest = task->versions.rbegin()->first;
    tasks_.erase(it);
    metrics_.tasks_held.Set(static_cast<double>(tasks_.size()));
    task->released = true;
    if (task->session != nullptr) task->session->Abandon();
  }
  // `task` (its models and session) is freed here, outside the lock, unless a push still holds it.
  return newest;
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
  {
    absl::MutexLock lock(&mu_);
    --leases_;
    metrics_.pushes_in_flight.Set(leases_);
  }
  RecycleBuffer(std::move(buffer));
}

void AggregatorCore::RecycleBuffer(std::vector<float> buffer) {
  staging_buffers_->Give(std::move(buffer));
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
  std::shared_ptr<TaskState> task;
  std::shared_ptr<AggregationSession> session;
  PushTarget target;
  {
    absl::MutexLock lock(&mu_);
    task = FindTask(meta.task);
    if (task == nullptr) {
      return reject(RejectReason::kUnknownTask,
                    absl::NotFoundError(absl::StrCat("unknown ", TaskLabel(meta.task))));
    }
    session = task->session;
    if (session == nullptr) {
      return reject(RejectReason::kRoundNotOpen,
                    absl::FailedPreconditionError(absl::StrCat(
                        TaskLabel(meta.task),
                        " has no federated-async buffer open, nor a round (nothing to push into "
                        "yet)")));
    }
    if (absl::Status s = session->Target(*task, meta, target); !s.ok()) {
      return reject(target.reason, s);
    }
    if (target.duplicate) return std::unique_ptr<Push>();
    if (leases_ >= options_.max_concurrent_pushes) {
      return reject(RejectReason::kBusy, absl::ResourceExhaustedError(absl::StrCat(
                                             "all ", options_.max_concurrent_pushes,
                                             " staging buffers are busy; retry later")));
    }
    ++leases_;
    metrics_.pushes_in_flight.Set(leases_);
    session->StartPushing(meta.peer_id);
  }
  // Decoding into a pooled buffer of the right size touches no fresh memory.
  tensor::FrameDecoder decoder = tensor::FrameDecoder::ForLayout(
      target.model->layout, /*require_finite=*/true, staging_buffers_->Take());
  return std::unique_ptr<Push>(new Push(this, std::move(task), std::move(session), meta,
                                        std::move(decoder), target.max_norm,
                                        target.staleness_factor));
}

AggregatorCore::Push::Push(AggregatorCore* core, std::shared_ptr<TaskState> task,
                           std::shared_ptr<AggregationSession> session, PushMeta meta,
                           tensor::FrameDecoder decoder, double max_norm, double staleness_factor)
    : core_(core),
      task_(std::move(task)),
      session_(std::move(session)),
      decoder_(std::move(decoder)),
      max_norm_(max_norm) {
  update_.meta = std::move(meta);
  update_.staleness_factor = staleness_factor;
}

AggregatorCore::Push::~Push() {
  if (!done_) Reject(RejectReason::kIncomplete);
  // An accepted update was (or may have been) acknowledged: it must reach the aggregate, and
  // a close waits for its fold.
  if (fold_pending_) Fold();
  std::vector<float> values = update_.values.capacity() > 0 ? std::move(update_.values)
                                                            : std::move(decoder_).ReleaseBuffer();
  {
    absl::MutexLock lock(&core_->mu_);
    session_->StopPushing(update_.meta.peer_id);
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
  update_.sum_squares = decoder_.sum_squares();
  update_.bytes_received = decoder_.bytes_received();
  auto model = std::move(decoder_).Finish();
  if (!model.ok()) return RejectWith(RejectReason::kIncomplete, model.status());
  update_.values = std::move(model->values);
  absl::Status s = aggregation::CheckNormBound(std::sqrt(update_.sum_squares), max_norm_);
  if (!s.ok()) return RejectWith(RejectReason::kNormBound, s);
  Acceptance acceptance = session_->Accept(*task_, update_);
  if (!acceptance.status.ok()) return RejectWith(acceptance.reason, acceptance.status);
  done_ = true;
  duplicate_ = acceptance.duplicate;
  fold_pending_ = acceptance.fold_pending;
  replica_ = std::move(acceptance.replica);
  return absl::OkStatus();
}

void AggregatorCore::Push::Fold() {
  if (!fold_pending_) return;
  fold_pending_ = false;
  session_->Fold(task_, update_);
}

absl::Status AggregatorCore::Push::Commit() {
  absl::Status s = Accept();
  if (s.ok()) Fold();
  return s;
}

}  // namespace shoal::aggregator
