#include "services/peer_agent/modes/federated_async/federated_async_runner.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/tensor/frame_codec.h"
#include "services/peer_agent/reports.h"

namespace shoal::peer {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;

absl::Status FederatedAsyncOptions::Validate() const {
  if (rpc_timeout <= absl::ZeroDuration() || transfer_budget <= absl::ZeroDuration() ||
      retry_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("federated-async options: timeouts must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FederatedAsyncRunner>> FederatedAsyncRunner::Create(
    ModeRunnerDeps deps, FederatedAsyncOptions options) {
  SHOAL_RETURN_IF_ERROR(
      CheckRunnerDeps(deps, common::v1::MODE_FEDERATED_ASYNC, {.aggregator = true}));
  SHOAL_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<FederatedAsyncRunner>(
      new FederatedAsyncRunner(std::move(deps), std::move(options)));
}

absl::StatusOr<std::unique_ptr<ModeRunner>> CreateFederatedAsyncRunner(ModeRunnerDeps deps) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<FederatedAsyncRunner> runner,
                         FederatedAsyncRunner::Create(std::move(deps)));
  return std::unique_ptr<ModeRunner>(std::move(runner));
}

FederatedAsyncRunner::FederatedAsyncRunner(ModeRunnerDeps deps, FederatedAsyncOptions options)
    : deps_(std::move(deps)),
      options_(std::move(options)),
      task_(deps_.assigned.spec().name()),
      trainer_(*deps_.trainer),
      aggregator_(*deps_.aggregator),
      metrics_(*deps_.metrics),
      wakeup_(*deps_.wakeup),
      peer_(deps_, {options_.rpc_timeout, options_.retry_backoff, options_.slowest_link}) {}

void FederatedAsyncRunner::ReportError(const absl::Status& error) {
  LogWarning("task ", task_, ": ", error.message());
  if (error.message() == last_error_) return;  // one report per kind of trouble, not per round
  last_error_ = std::string(error.message());
  deps_.send(MakePeerError(0, error));
}

void FederatedAsyncRunner::Start() {
  LogInfo("task ", task_, ": federated-async through the aggregator at ",
          peer_.address().empty() ? std::string("(none yet)") : peer_.address());
}

bool FederatedAsyncRunner::Intercept(const CoordinatorEvent& e) {
  if (e.has_train_async()) {
    // Versions named before it may be another aggregator's (the task moved): the new sequence
    // starts at TrainAsync.model_version. Queued: the worker starts the loop.
    absl::MutexLock lock(&mu_);
    newest_published_ = 0;
    return false;
  }
  if (!e.has_model_published()) return false;
  bool running;
  {
    absl::MutexLock lock(&mu_);
    newest_published_ = std::max(newest_published_, e.model_published().version());
    running = running_;
  }
  wakeup_.Notify();  // a loop waiting for a newer version goes on
  // The loop evaluates it between pushes; an idle runner evaluates it when it is handled.
  return running;
}

bool FederatedAsyncRunner::Supersedes(const CoordinatorEvent& e) const {
  return e.has_train_async() || e.has_task_assigned() || e.has_task_finished();
}

void FederatedAsyncRunner::SetRunning(bool running) {
  absl::MutexLock lock(&mu_);
  running_ = running;
}

uint64_t FederatedAsyncRunner::NewestPublished() const {
  absl::MutexLock lock(&mu_);
  return newest_published_;
}

uint64_t FederatedAsyncRunner::TargetVersion() const {
  const uint64_t floor = train_ ? train_->model_version() : 0;
  return std::max(NewestPublished(), floor);
}

void FederatedAsyncRunner::Handle(const CoordinatorEvent& e,
                                  const std::function<bool()>& keep_going) {
  switch (e.kind_case()) {
    case CoordinatorEvent::kTaskAssigned:
      HandleTaskAssigned(e.task_assigned());
      break;
    case CoordinatorEvent::kTrainAsync:
      if (!HandleTrainAsync(e.train_async())) return;
      break;
    case CoordinatorEvent::kModelPublished:
      HandleModelPublished(keep_going);
      break;
    case CoordinatorEvent::kInitializeModel:
      peer_.UploadInitialModel(e.initialize_model(), options_.transfer_budget);
      break;
    case CoordinatorEvent::kWaiting:
      LogInfo("task ", task_, ": waiting for peers (", e.waiting().have(), " of ",
              e.waiting().need(), ")");
      break;
    default:
      LogWarning("task ", task_, ": ignoring coordinator event (field ",
                 static_cast<int>(e.kind_case()), ") in federated-async mode");
  }
  // Once started, the loop runs until the task ends: whatever event stopped it (a TrainAsync, a
  // TaskAssigned, or any event queued while the agent had no runner yet, which the agent treats
  // as superseding), it resumes here; with another event queued, keep_going is already false.
  if (train_) Run(keep_going);
}

void FederatedAsyncRunner::HandleTaskAssigned(const coordinator::v1::TaskAssigned& m) {
  // The same task again: after a reconnect, or moved to another aggregator (the old one died).
  if (peer_.Reassign(m.aggregator_address())) {
    // The new aggregator numbers versions from the checkpoint it restored: the model held and
    // the versions evaluated belong to the old one.
    peer_.Forget();
    last_evaluated_ = 0;
    last_pushed_base_.reset();
  }
  // The loop resumes (Handle); the TrainAsync that usually follows supersedes it at once.
}

bool FederatedAsyncRunner::HandleTrainAsync(const coordinator::v1::TrainAsync& m) {
  if (m.round_batches() == 0) {
    ReportError(absl::InvalidArgumentError("TrainAsync with round_batches 0: nothing to train"));
    return false;
  }
  // A version held above the new starting point belongs to an aggregator that restored an
  // older checkpoint since (same numbers, other contents): download again.
  if (peer_.global_version() && *peer_.global_version() > m.model_version()) peer_.Forget();
  if (last_pushed_base_ && *last_pushed_base_ > m.model_version()) last_pushed_base_.reset();
  train_ = m;
  LogInfo("task ", task_, ": training asynchronously, ", m.round_batches(),
          " batches per push, from version ", TargetVersion(), " on");
  return true;
}

void FederatedAsyncRunner::HandleModelPublished(const std::function<bool()>& keep_going) {
  // A running loop evaluates between pushes (Handle resumes it).
  if (train_ || NewestPublished() <= last_evaluated_) return;
  const uint64_t version = TargetVersion();
  if (absl::Status s = LoadGlobal(version, keep_going); !s.ok()) {
    LogWarning("task ", task_, ": cannot get published model version ", version, ": ", s.message());
    return;
  }
  MaybeEvaluate(version);
}

void FederatedAsyncRunner::Run(const std::function<bool()>& keep_going) {
  SetRunning(true);
  while (keep_going()) {
    const uint64_t version = TargetVersion();
    const Outcome outcome = Iterate(version, keep_going);
    if (outcome == Outcome::kStopped) break;
    if (outcome != Outcome::kPushed && outcome != Outcome::kNewerVersion) {
      WaitForNewerThan(version, keep_going);
    }
  }
  SetRunning(false);
}

void FederatedAsyncRunner::WaitForNewerThan(uint64_t version,
                                            const std::function<bool()>& keep_going) {
  wakeup_.SleepFor(options_.retry_wait,
                   [&] { return keep_going() && NewestPublished() <= version; });
}

FederatedAsyncRunner::Outcome FederatedAsyncRunner::Iterate(
    uint64_t version, const std::function<bool()>& keep_going) {
  // 1. The newest global version known, exactly: after a push the trained parameters go.
  if (absl::Status s = LoadGlobal(version, keep_going); !s.ok()) {
    if (!keep_going()) return Outcome::kStopped;
    const std::string why =
        absl::StrCat("cannot get global model version ", version, ": ", s.message());
    if (absl::IsInvalidArgument(s)) {
      ReportError(absl::InvalidArgumentError(why));  // a model this peer cannot train
    } else {
      LogWarning("task ", task_, ": ", why);  // not there (yet), or unreachable: wait, retry
    }
    return Outcome::kFailed;
  }
  // 2. Evaluate it when it is newer than what this peer evaluated last.
  MaybeEvaluate(version);
  // 3. Train. Training again from the version of this peer's last push is speculative (no newer
  // version was out when it pushed): its update would repeat that one's base, so a newer version
  // that arrives meanwhile cuts it short and the loop goes on from there. With peers of equal
  // speed this keeps every update fresh, as in federated-sync, without waiting.
  const bool speculative = last_pushed_base_ == version;
  auto train_on = [&] { return keep_going() && !(speculative && NewestPublished() > version); };
  absl::StatusOr<training::TrainStats> stats =
      trainer_.TrainBatches(train_->round_batches(), train_on);
  peer_.Trained();
  if (!stats.ok()) {
    if (absl::IsCancelled(stats.status()) && keep_going()) {
      metrics_.federated_async.restarts.Increment();
      LogInfo("task ", task_, ": version ", NewestPublished(),
              " is out: training from it instead of again from version ", version);
      return Outcome::kNewerVersion;
    }
    if (absl::IsCancelled(stats.status())) {
      metrics_.rounds_abandoned.Increment();
      LogInfo("task ", task_, ": training from version ", version,
              " stopped (superseded or stopping: ", stats.status().message(), ")");
      return Outcome::kStopped;
    }
    ReportError(stats.status());
    return Outcome::kFailed;
  }
  metrics_.samples_trained.Increment(static_cast<double>(stats->samples));
  metrics_.train_loss.Set(stats->mean_loss);
  absl::StatusOr<tensor::FlatModel> params = trainer_.GetState(/*include_buffers=*/true);
  if (!params.ok()) {
    ReportError(params.status());
    return Outcome::kFailed;
  }
  // 4. Push the delta against the version trained from.
  absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> delta =
      peer_.DeltaOf(*std::move(params));
  if (!delta.ok()) {
    ReportError(delta.status());
    return Outcome::kFailed;
  }
  return Push(version, *stats, *std::move(delta), keep_going);
}

FederatedAsyncRunner::Outcome FederatedAsyncRunner::Push(
    uint64_t version, const training::TrainStats& stats,
    std::shared_ptr<const tensor::EncodedModel> delta, const std::function<bool()>& keep_going) {
  aggregator::v1::UpdateMeta meta;
  meta.set_task(task_);
  meta.set_round(0);  // the task's buffer
  const aggregator::Caller me = peer_.Me();
  meta.set_peer_id(me.peer_id);
  meta.set_session_token(me.session_token);
  meta.set_base_version(version);
  meta.set_num_samples(stats.samples);
  meta.set_train_loss(stats.mean_loss);
  meta.set_train_ms(absl::ToInt64Milliseconds(stats.duration));
  const std::string address = peer_.address();
  const absl::Time start = deps_.clock->Now();
  absl::StatusOr<bool> pushed = peer_.RetryCall(
      peer_.TransferDeadline(options_.transfer_budget, delta->payload_bytes()), keep_going,
      [&](absl::Time deadline) {
        return aggregator_.PushUpdate(address, meta, delta, deadline);  // shared, no copy
      },
      delta->payload_bytes());
  if (pushed.ok()) {
    metrics_.federated_async.pushes_accepted.Increment();
    metrics_.bytes_sent.Increment(static_cast<double>(delta->payload_bytes()));
    metrics_.update_bytes_sent.Increment(static_cast<double>(delta->payload_bytes()));
    metrics_.update_bytes_raw.Increment(static_cast<double>(delta->layout.total_bytes()));
    last_error_.clear();
    last_pushed_base_ = version;
    LogInfo(absl::StrFormat(
        "task %s: pushed %d batches trained from version %d, loss %.4f, %d bytes "
        "(%d of %d values) in %.3f s%s",
        task_, stats.batches, version, stats.mean_loss, delta->payload_bytes(),
        delta->values_sent(), delta->layout.total_elements(),
        absl::ToDoubleSeconds(deps_.clock->Now() - start), *pushed ? " (duplicate)" : ""));
    return Outcome::kPushed;
  }
  const absl::Status& s = pushed.status();
  if (absl::IsFailedPrecondition(s)) {
    metrics_.federated_async.stale_refusals.Increment();
    LogInfo("task ", task_, ": push trained from version ", version,
            " refused, going on from the newest version: ", s.message());
    return Outcome::kRefused;
  }
  if (!keep_going()) return Outcome::kStopped;
  if (absl::IsInvalidArgument(s)) {
    metrics_.updates_rejected.Increment();
    ReportError(absl::Status(s.code(), absl::StrCat("update rejected: ", s.message())));
  } else {
    LogWarning("task ", task_, ": could not push the update trained from version ", version, ": ",
               s.message());
  }
  return Outcome::kFailed;
}

absl::Status FederatedAsyncRunner::LoadGlobal(uint64_t version,
                                              const std::function<bool()>& keep_going) {
  SHOAL_RETURN_IF_ERROR(peer_.LoadGlobal(
      version, peer_.TransferDeadline(options_.transfer_budget, peer_.ModelBytes()), keep_going));
  peer_.PublishSnapshot(version);
  return absl::OkStatus();
}

void FederatedAsyncRunner::MaybeEvaluate(uint64_t version) {
  // Only once a ModelPublished named a version this peer has not evaluated: the model held is
  // at least that new, and its report settles the older versions at the coordinator.
  if (NewestPublished() <= last_evaluated_ || version <= last_evaluated_) return;
  absl::StatusOr<training::EvalStats> eval = trainer_.Evaluate();
  if (!eval.ok()) {
    ReportError(absl::Status(eval.status().code(), absl::StrCat("evaluating version ", version,
                                                                ": ", eval.status().message())));
    return;
  }
  last_evaluated_ = version;
  metrics_.federated_async.versions_evaluated.Increment();
  metrics_.test_accuracy.Set(eval->accuracy());
  LogInfo(absl::StrFormat("task %s: model version %d test accuracy %.4f (%d/%d)", task_, version,
                          eval->accuracy(), eval->correct, eval->total));
  deps_.send(MakeEvalReport(version, *eval));
}

}  // namespace shoal::peer
