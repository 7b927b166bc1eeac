#include "services/aggregator/aggregator_core.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/aggregation/update_validation.h"
#include "libs/common/escape.h"

namespace shoal::aggregator {

// The round a task is in. Fields are guarded by AggregatorCore::mu_, except `acc`, which folds
// touch under `fold_mu` while the round is open and CloseRound owns once it is kClosing with no
// fold in flight.
struct AggregatorCore::Round {
  enum class State { kOpen, kClosing, kClosed, kAbandoned };

  uint64_t number = 0;
  uint64_t base_version = 0;
  std::shared_ptr<const tensor::FlatModel> base;
  std::set<std::string> expected;
  double max_norm = 0;
  State state = State::kOpen;
  std::set<std::string> accepted;  // peers whose updates were folded in
  std::set<std::string> pushing;   // peers with a push in progress
  int folds_in_flight = 0;         // accepted pushes whose fold has not finished
  absl::Status fold_error;         // first failed fold (an invariant broke); the round cannot close
  uint64_t num_samples = 0;
  double loss_sum = 0;  // sum of train_loss * num_samples
  absl::Time opened_at;

  absl::Mutex fold_mu;
  std::unique_ptr<aggregation::WeightedMeanAccumulator> acc;
};

struct AggregatorCore::Task {
  struct Version {
    std::shared_ptr<const tensor::FlatModel> model;
    uint64_t digest = 0;
  };
  std::string name;
  std::map<uint64_t, Version> versions;  // guarded by AggregatorCore::mu_ (as all fields)
  uint64_t latest = 0;
  std::shared_ptr<Round> round;            // the current (or last) round
  std::map<uint64_t, RoundResult> closed;  // results of recently closed rounds
  bool released = false;
};

namespace {

const char* StateName(AggregatorCore::Round* r);

}  // namespace

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

AggregatorCore::~AggregatorCore() = default;

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

// ---------------------------------------------------------------------------------------------
// Models

absl::StatusOr<PutResult> AggregatorCore::PutModel(const std::string& name, uint64_t version,
                                                   tensor::FlatModel model) {
  if (name.empty()) return absl::InvalidArgumentError("ModelMeta.task is empty");
  if (model.values.size() != model.layout.total_elements()) {
    return absl::InvalidArgumentError("model values do not match its layout");
  }
  const uint64_t digest = model.Digest();
  // Held as const, created mutable: CloseRound may recycle an evicted version's buffer.
  std::shared_ptr<const tensor::FlatModel> shared =
      std::make_shared<tensor::FlatModel>(std::move(model));
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Task>& task = tasks_[name];
  if (task == nullptr) {
    task = std::make_shared<Task>();
    task->name = name;
  }
  if (!task->versions.empty()) {
    if (version < task->latest) {
      return absl::FailedPreconditionError(absl::StrCat("task '", EscapeBytes(name),
                                                        "' already holds version ", task->latest,
                                                        ", newer than ", version));
    }
    if (version == task->latest) {
      const Task::Version& held = task->versions.at(version);
      if (held.digest == digest && held.model->layout == shared->layout) {
        return PutResult{version, digest};
      }
      return absl::FailedPreconditionError(absl::StrCat("task '", EscapeBytes(name),
                                                        "' already holds version ", version,
                                                        " with different contents"));
    }
  }
  task->versions[version] = Task::Version{std::move(shared), digest};
  task->latest = version;
  EvictOldVersions(*task);
  AbandonRound(*task);
  metrics_.model_version.Set(static_cast<double>(version));
  return PutResult{version, digest};
}

absl::StatusOr<ModelSnapshot> AggregatorCore::GetModel(const std::string& name,
                                                       std::optional<uint64_t> version) const {
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(name);
  if (task == nullptr || task->versions.empty()) {
    return absl::NotFoundError(absl::StrCat("unknown task '", EscapeBytes(name), "'"));
  }
  const uint64_t want = version.value_or(task->latest);
  auto it = task->versions.find(want);
  if (it == task->versions.end()) {
    std::vector<uint64_t> held;
    for (const auto& [v, _] : task->versions) held.push_back(v);
    return absl::NotFoundError(absl::StrCat("version ", want, " of task '", EscapeBytes(name),
                                            "' is not held (held: ", absl::StrJoin(held, ", "),
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
                                                   EscapeBytes(peer_id), "' of task '",
                                                   EscapeBytes(task), "'"));
  }
  return absl::OkStatus();
}

uint64_t AggregatorCore::Watch(const std::string& name, TaskEventFn on_event) {
  v1::TaskEvent event;
  v1::WatchStarted& started = *event.mutable_started();
  // The snapshot and the registration happen under mu_ together: an update accepted before
  // them is in the snapshot (and maybe delivered again, harmlessly), one accepted after them is
  // delivered, since AcceptPush notifies only after it released mu_.
  absl::ReaderMutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(name);
  if (task != nullptr && !task->versions.empty()) {
    started.set_has_model(true);
    started.set_latest_version(task->latest);
    if (task->round != nullptr && task->round->state == Round::State::kOpen) {
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
  }
  // `task` (and its models) are freed here, outside the lock, unless a push still holds it.
}

// ---------------------------------------------------------------------------------------------
// Rounds

absl::Status AggregatorCore::OpenRound(const OpenRoundParams& p) {
  if (p.round == 0) return absl::InvalidArgumentError("round must be >= 1");
  if (!(p.max_update_norm >= 0) || !std::isfinite(p.max_update_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_update_norm must be finite and >= 0, got ", p.max_update_norm));
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Task> task = FindTask(p.task);
  if (task == nullptr || task->versions.empty()) {
    return absl::NotFoundError(absl::StrCat("unknown task '", EscapeBytes(p.task), "'"));
  }
  std::shared_ptr<Round> cur = task->round;
  if (cur != nullptr && cur->number == p.round) {
    if (cur->state == Round::State::kOpen) {
      if (cur->base_version != p.base_version) {
        return absl::FailedPreconditionError(absl::StrCat(
            "round ", p.round, " of task '", EscapeBytes(p.task), "' is open with base version ",
            cur->base_version, ", not ", p.base_version));
      }
      // Idempotent re-open; the latest expected set and bound win.
      cur->expected = std::set<std::string>(p.expected_peers.begin(), p.expected_peers.end());
      cur->max_norm = p.max_update_norm;
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat("round ", p.round, " of task '",
                                                      EscapeBytes(p.task), "' is already ",
                                                      StateName(cur.get())));
  }
  if (task->closed.count(p.round) > 0 || (cur != nullptr && p.round < cur->number)) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", p.round, " of task '", EscapeBytes(p.task),
                     "' is older than the current round ", cur ? cur->number : 0));
  }
  if (cur != nullptr && cur->state == Round::State::kClosing) {
    return absl::AbortedError(absl::StrCat("round ", cur->number, " of task '", EscapeBytes(p.task),
                                           "' is still closing; retry"));
  }
  auto base = task->versions.find(p.base_version);
  if (base == task->versions.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("base version ", p.base_version, " of task '", EscapeBytes(p.task),
                     "' is not held (latest is ", task->latest, ")"));
  }
  if (p.base_version != task->latest) {
    return absl::FailedPreconditionError(absl::StrCat("base version ", p.base_version, " of task '",
                                                      EscapeBytes(p.task), "' is not the latest (",
                                                      task->latest, ")"));
  }
  auto round = std::make_shared<Round>();
  round->number = p.round;
  round->base_version = p.base_version;
  round->base = base->second.model;
  round->expected = std::set<std::string>(p.expected_peers.begin(), p.expected_peers.end());
  round->max_norm = p.max_update_norm;
  round->opened_at = clock_.Now();
  // Reuse the previous round's sum buffer when nothing can touch it any more.
  if (cur != nullptr && cur->state == Round::State::kClosed && cur->folds_in_flight == 0 &&
      cur->acc != nullptr && cur->acc->layout() == round->base->layout) {
    round->acc = std::move(cur->acc);
    round->acc->Reset();
  } else {
    round->acc = std::make_unique<aggregation::WeightedMeanAccumulator>(round->base->layout,
                                                                        options_.fold_threads);
  }
  AbandonRound(*task);
  task->round = std::move(round);
  return absl::OkStatus();
}

absl::StatusOr<RoundResult> AggregatorCore::CloseRound(const std::string& name, uint64_t number) {
  std::shared_ptr<Task> task;
  std::shared_ptr<Round> round;
  RoundResult result;
  std::vector<float> recycled;
  {
    absl::MutexLock lock(&mu_);
    task = FindTask(name);
    if (task == nullptr)
      return absl::NotFoundError(absl::StrCat("unknown task '", EscapeBytes(name), "'"));
    if (auto it = task->closed.find(number); it != task->closed.end()) return it->second;
    round = task->round;
    if (round == nullptr || round->number != number || round->state == Round::State::kAbandoned) {
      return absl::NotFoundError(
          absl::StrCat("round ", number, " of task '", EscapeBytes(name), "' is not open"));
    }
    if (round->state == Round::State::kClosing) {
      // Another CloseRound is applying this round; wait for its result.
      Round* r = round.get();
      mu_.Await(absl::Condition(
          +[](Round* r) { return r->state != Round::State::kClosing; }, r));
      if (auto it = task->closed.find(number); it != task->closed.end()) return it->second;
      return absl::AbortedError(absl::StrCat("round ", number, " of task '", EscapeBytes(name),
                                             "' was abandoned while closing"));
    }
    round->state = Round::State::kClosing;
    // Pushes already folding finish first; no new fold starts once the round is closing.
    mu_.Await(absl::Condition(
        +[](Round* r) { return r->folds_in_flight == 0; }, round.get()));
    if (!round->fold_error.ok()) {
      // An accepted update is missing from the sum; publishing would silently drop it.
      round->state = Round::State::kAbandoned;
      return absl::InternalError(absl::StrCat("round ", number, " of task '", EscapeBytes(name),
                                              "' lost an update: ", round->fold_error.message()));
    }
    result.contributors.assign(round->accepted.begin(), round->accepted.end());
    result.num_samples = round->num_samples;
    result.mean_train_loss =
        round->num_samples > 0 ? round->loss_sum / static_cast<double>(round->num_samples) : 0;
    // Publishing will evict the oldest version; when nobody else holds it, recycle its buffer
    // for the new model (saves the first-touch cost of a fresh model-sized allocation).
    if (!result.contributors.empty() &&
        task->versions.size() >= static_cast<size_t>(options_.versions_kept)) {
      auto oldest = task->versions.begin();
      if (oldest->first != round->base_version && oldest->second.model.use_count() == 1 &&
          oldest->second.model->layout == round->base->layout) {
        recycled = std::move(const_cast<tensor::FlatModel&>(*oldest->second.model).values);
        task->versions.erase(oldest);
      }
    }
  }

  // The sum is ours now: apply it without holding the lock (one pass over the model).
  std::shared_ptr<const tensor::FlatModel> next;
  if (!result.contributors.empty()) {
    auto applied = std::make_shared<tensor::FlatModel>();
    applied->layout = round->base->layout;
    applied->values = std::move(recycled);
    absl::Status s = round->acc->ApplyInto(*round->base, applied->values);
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      round->state = Round::State::kAbandoned;
      return s;
    }
    result.version = round->base_version + 1;
    result.digest = applied->Digest();
    next = std::move(applied);
  } else {
    result.version = round->base_version;
  }

  absl::MutexLock lock(&mu_);
  if (task->released || task->latest != round->base_version) {
    round->state = Round::State::kAbandoned;
    return absl::AbortedError(absl::StrCat("task '", EscapeBytes(name), "' changed while round ",
                                           number, " was closing"));
  }
  if (next != nullptr) {
    task->versions[result.version] = Task::Version{std::move(next), result.digest};
    task->latest = result.version;
    EvictOldVersions(*task);
  } else {
    result.digest = task->versions.at(result.version).digest;
  }
  round->state = Round::State::kClosed;
  task->closed[number] = result;
  while (task->closed.size() > static_cast<size_t>(options_.closed_rounds_kept)) {
    task->closed.erase(task->closed.begin());
  }
  metrics_.rounds_completed.Increment();
  metrics_.round_duration.Observe(absl::ToDoubleSeconds(clock_.Now() - round->opened_at));
  metrics_.model_version.Set(static_cast<double>(result.version));
  return result;
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
  if (buffer.capacity() > 0 &&
      free_buffers_.size() < static_cast<size_t>(options_.max_concurrent_pushes)) {
    free_buffers_.push_back(std::move(buffer));
  }
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
  if (absl::Status s =
          CheckCaller(meta.task, meta.peer_id, meta.session_token, meta.caller_identity);
      !s.ok()) {
    return reject(RejectReason::kUnauthenticated, s);
  }
  std::shared_ptr<Task> task;
  std::shared_ptr<Round> round;
  std::vector<float> buffer;
  {
    absl::MutexLock lock(&mu_);
    task = FindTask(meta.task);
    if (task == nullptr) {
      return reject(
          RejectReason::kUnknownTask,
          absl::NotFoundError(absl::StrCat("unknown task '", EscapeBytes(meta.task), "'")));
    }
    round = task->round;
    if (round != nullptr && round->number == meta.round &&
        round->accepted.count(meta.peer_id) > 0) {
      return std::unique_ptr<Push>();  // duplicate of an accepted push
    }
    if (round == nullptr || round->number != meta.round || round->state != Round::State::kOpen) {
      return reject(RejectReason::kRoundNotOpen,
                    absl::FailedPreconditionError(absl::StrCat(
                        "round ", meta.round, " of task '", EscapeBytes(meta.task), "' is not open",
                        round ? absl::StrCat(" (current round ", round->number, " is ",
                                             StateName(round.get()), ")")
                              : std::string())));
    }
    if (round->expected.count(meta.peer_id) == 0) {
      return reject(RejectReason::kUnexpectedPeer,
                    absl::FailedPreconditionError(absl::StrCat(
                        "peer '", EscapeBytes(meta.peer_id), "' is not expected in round ",
                        meta.round, " of task '", EscapeBytes(meta.task), "'")));
    }
    if (meta.base_version != round->base_version) {
      return reject(
          RejectReason::kStaleBase,
          absl::FailedPreconditionError(absl::StrCat(
              "update was trained from version ", meta.base_version, " but round ", meta.round,
              " of task '", EscapeBytes(meta.task), "' folds into version ", round->base_version)));
    }
    if (round->pushing.count(meta.peer_id) > 0) {
      return reject(
          RejectReason::kBusy,
          absl::AbortedError(absl::StrCat("a push from peer '", EscapeBytes(meta.peer_id),
                                          "' for round ", meta.round, " is already in progress")));
    }
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
    round->pushing.insert(meta.peer_id);
  }
  // Decoding into a pooled buffer of the right size touches no fresh memory.
  tensor::FrameDecoder decoder = tensor::FrameDecoder::ForLayout(
      round->base->layout, /*require_finite=*/true, std::move(buffer));
  const double max_norm = round->max_norm;
  return std::unique_ptr<Push>(
      new Push(this, std::move(task), std::move(round), meta, std::move(decoder), max_norm));
}

AggregatorCore::Push::Push(AggregatorCore* core, std::shared_ptr<Task> task,
                           std::shared_ptr<Round> round, PushMeta meta,
                           tensor::FrameDecoder decoder, double max_norm)
    : core_(core),
      task_(std::move(task)),
      round_(std::move(round)),
      meta_(std::move(meta)),
      decoder_(std::move(decoder)),
      max_norm_(max_norm) {}

AggregatorCore::Push::~Push() {
  if (!done_) Reject(RejectReason::kIncomplete);
  // An accepted update was (or may have been) acknowledged: it must reach the sum, and
  // CloseRound waits for its folds_in_flight count.
  if (fold_pending_) Fold();
  std::vector<float> buffer =
      buffer_.capacity() > 0 ? std::move(buffer_) : std::move(decoder_).ReleaseBuffer();
  {
    absl::MutexLock lock(&core_->mu_);
    round_->pushing.erase(meta_.peer_id);
  }
  core_->ReleaseStaging(std::move(buffer));
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
  const double norm = std::sqrt(decoder_.sum_squares());
  auto model = std::move(decoder_).Finish();
  if (!model.ok()) return RejectWith(RejectReason::kIncomplete, model.status());
  buffer_ = std::move(model->values);
  absl::Status s = aggregation::CheckNormBound(norm, max_norm_);
  if (!s.ok()) return RejectWith(RejectReason::kNormBound, s);
  return core_->AcceptPush(*this);
}

void AggregatorCore::Push::Fold() {
  if (fold_pending_) core_->FoldPush(*this);
}

absl::Status AggregatorCore::Push::Commit() {
  absl::Status s = Accept();
  if (s.ok()) Fold();
  return s;
}

absl::Status AggregatorCore::AcceptPush(Push& push) {
  Round& round = *push.round_;
  {
    absl::MutexLock lock(&mu_);
    if (round.state != Round::State::kOpen || push.task_->released) {
      return push.RejectWith(RejectReason::kRoundNotOpen,
                             absl::FailedPreconditionError(absl::StrCat(
                                 "round ", round.number, " of task '", EscapeBytes(push.meta_.task),
                                 "' closed before the update was complete")));
    }
    // Counted now, summed by FoldPush: CloseRound reads these only once folds_in_flight is 0.
    ++round.folds_in_flight;
    round.accepted.insert(push.meta_.peer_id);
    round.num_samples += push.meta_.num_samples;
    round.loss_sum += push.meta_.train_loss * static_cast<double>(push.meta_.num_samples);
  }
  push.done_ = true;
  push.fold_pending_ = true;
  metrics_.updates_accepted.Increment();
  v1::TaskEvent event;
  v1::PushAccepted& accepted = *event.mutable_push_accepted();
  accepted.set_round(round.number);
  accepted.set_peer_id(push.meta_.peer_id);
  accepted.set_base_version(push.meta_.base_version);
  accepted.set_num_samples(push.meta_.num_samples);
  Notify(push.meta_.task, event);
  return absl::OkStatus();
}

void AggregatorCore::FoldPush(Push& push) {
  Round& round = *push.round_;
  push.fold_pending_ = false;
  // Cannot fail for a validated update (the decoder enforced the round's layout, BeginPush a
  // positive sample count); an error means a broken invariant and is reported by CloseRound.
  // `acc` is stable without mu_: OpenRound only takes it from a closed round with no fold in
  // flight, and this push holds a folds_in_flight count.
  absl::Status s;
  {
    absl::MutexLock fold(&round.fold_mu);
    s = round.acc->Add(push.buffer_, static_cast<double>(push.meta_.num_samples));
  }
  absl::MutexLock lock(&mu_);
  if (!s.ok() && round.fold_error.ok()) round.fold_error = s;
  --round.folds_in_flight;
}

namespace {

const char* StateName(AggregatorCore::Round* r) {
  switch (r->state) {
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

}  // namespace

}  // namespace shoal::aggregator
