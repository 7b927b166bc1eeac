#include "services/peer_agent/modes/federated_sync/federated_sync_runner.h"

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

absl::Status FederatedSyncOptions::Validate() const {
  if (rpc_timeout <= absl::ZeroDuration() || model_transfer_budget <= absl::ZeroDuration() ||
      default_round_budget <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("federated-sync options: timeouts must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FederatedSyncRunner>> FederatedSyncRunner::Create(
    ModeRunnerDeps deps, FederatedSyncOptions options) {
  SHOAL_RETURN_IF_ERROR(
      CheckRunnerDeps(deps, common::v1::MODE_FEDERATED_SYNC, {.aggregator = true}));
  SHOAL_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<FederatedSyncRunner>(
      new FederatedSyncRunner(std::move(deps), std::move(options)));
}

absl::StatusOr<std::unique_ptr<ModeRunner>> CreateFederatedSyncRunner(ModeRunnerDeps deps) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<FederatedSyncRunner> runner,
                         FederatedSyncRunner::Create(std::move(deps)));
  return std::unique_ptr<ModeRunner>(std::move(runner));
}

FederatedSyncRunner::FederatedSyncRunner(ModeRunnerDeps deps, FederatedSyncOptions options)
    : deps_(std::move(deps)),
      options_(std::move(options)),
      task_(deps_.assigned.spec().name()),
      trainer_(*deps_.trainer),
      snapshots_(*deps_.snapshots),
      aggregator_(*deps_.aggregator),
      metrics_(*deps_.metrics),
      clock_(*deps_.clock),
      wakeup_(*deps_.wakeup),
      aggregator_address_(deps_.assigned.aggregator_address()) {}

void FederatedSyncRunner::Send(const PeerMessage& message) const { deps_.send(message); }

aggregator::Caller FederatedSyncRunner::Me() const {
  // The aggregator accepts this peer's calls only with the current session's token.
  return aggregator::Caller{deps_.peer_id, deps_.session_token ? deps_.session_token() : ""};
}

bool FederatedSyncRunner::TaskCurrent() const {
  return !deps_.task_current || deps_.task_current();
}

template <typename Attempt>
auto FederatedSyncRunner::RetryCall(absl::Time deadline, const std::function<bool()>& keep_going,
                                    Attempt&& attempt) {
  rpc::RetryOptions retry;
  retry.backoff = options_.retry_backoff;
  retry.attempt_timeout = options_.rpc_timeout;
  return rpc::Retry(clock_, retry, deadline, wakeup_.Sleeper(keep_going),
                    std::forward<Attempt>(attempt));
}

bool FederatedSyncRunner::Supersedes(const CoordinatorEvent& e) const {
  return e.has_round_started() || e.has_model_published() || e.has_task_finished() ||
         e.has_task_assigned();
}

void FederatedSyncRunner::Start() {
  LogInfo("task ", task_, ": federated-sync through the aggregator at ",
          aggregator_address_.empty() ? std::string("(none yet)") : aggregator_address_);
}

void FederatedSyncRunner::Handle(const CoordinatorEvent& e,
                                 const std::function<bool()>& keep_going) {
  switch (e.kind_case()) {
    case CoordinatorEvent::kTaskAssigned:
      HandleTaskAssigned(e.task_assigned());
      break;
    case CoordinatorEvent::kInitializeModel:
      HandleInitializeModel();
      break;
    case CoordinatorEvent::kRoundStarted:
      HandleRoundStarted(e.round_started(), keep_going);
      break;
    case CoordinatorEvent::kModelPublished:
      HandleModelPublished(e.model_published());
      break;
    case CoordinatorEvent::kWaiting:
      LogInfo("task ", task_, ": waiting for peers (", e.waiting().have(), " of ",
              e.waiting().need(), ")");
      break;
    default:
      LogWarning("task ", task_, ": ignoring coordinator event (field ",
                 static_cast<int>(e.kind_case()), ") in federated-sync mode");
  }
}

void FederatedSyncRunner::HandleTaskAssigned(const coordinator::v1::TaskAssigned& m) {
  // The same task again: after a reconnect, or moved to another aggregator (the old one died).
  if (m.aggregator_address() != aggregator_address_) {
    LogInfo("task ", task_, ": assigned again, now through the aggregator at ",
            m.aggregator_address(), " (was ", aggregator_address_, ")");
    aggregator_address_ = m.aggregator_address();
  } else {
    LogInfo("task ", task_, ": assigned again (aggregator ", aggregator_address_, ")");
  }
}

void FederatedSyncRunner::PublishSnapshot(uint64_t version) {
  absl::StatusOr<tensor::FlatModel> params = trainer_.GetParameters();
  if (!params.ok()) return;
  snapshots_.Publish(
      Snapshot{task_, version, std::make_shared<const tensor::FlatModel>(*std::move(params))});
}

void FederatedSyncRunner::HandleInitializeModel() {
  absl::StatusOr<tensor::FlatModel> init = trainer_.InitialParameters();
  absl::Status status = init.status();
  std::shared_ptr<const tensor::FlatModel> model;
  if (status.ok()) {
    model = std::make_shared<const tensor::FlatModel>(*std::move(init));
    const common::v1::ModelMeta meta = tensor::MakeModelMeta(task_, 0, *model);
    const std::string address = aggregator_address_;
    absl::StatusOr<uint64_t> put = RetryCall(
        clock_.Now() + options_.model_transfer_budget, [this] { return TaskCurrent(); },
        [&](absl::Time deadline) {
          return aggregator_.PutModel(address, meta, model, Me(), deadline);
        });
    status = put.status();
  }
  if (!status.ok()) {
    LogError("task ", task_, ": could not upload the initial model: ", status.message());
    Send(MakePeerError(0, status));
    return;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(model->layout.total_bytes()));
  if (absl::Status s = trainer_.SetParameters(*model); !s.ok()) {
    LogError("task ", task_, ": ", s.message());
  }
  const uint64_t digest = model->Digest();
  global_version_ = 0;
  global_ = *model;
  params_are_global_ = true;
  PublishSnapshot(0);
  LogInfo(absl::StrFormat("task %s: initial model uploaded (%d parameters, digest %016x)", task_,
                          global_.values.size(), digest));
  PeerMessage out;
  out.mutable_model_initialized()->set_digest_xxh3(digest);
  Send(out);
}

absl::Status FederatedSyncRunner::LoadGlobal(uint64_t version, absl::Time deadline,
                                             const std::function<bool()>& keep_going) {
  if (global_version_ == version) {
    if (!params_are_global_) {
      SHOAL_RETURN_IF_ERROR(trainer_.SetParameters(global_));
      params_are_global_ = true;
    }
    return absl::OkStatus();
  }
  const std::string address = aggregator_address_;
  SHOAL_ASSIGN_OR_RETURN(
      tensor::FlatModel model, RetryCall(deadline, keep_going, [&](absl::Time attempt_deadline) {
        return aggregator_.GetModel(address, task_, version, Me(), attempt_deadline);
      }));
  metrics_.bytes_received.Increment(static_cast<double>(model.layout.total_bytes()));
  SHOAL_RETURN_IF_ERROR(trainer_.SetParameters(model));
  global_version_ = version;
  global_ = std::move(model);
  params_are_global_ = true;
  return absl::OkStatus();
}

void FederatedSyncRunner::HandleRoundStarted(const coordinator::v1::RoundStarted& m,
                                             const std::function<bool()>& keep_going_event) {
  const absl::Time start = clock_.Now();
  const absl::Time deadline = m.deadline_unix_ms() > 0 ? absl::FromUnixMillis(m.deadline_unix_ms())
                                                       : start + options_.default_round_budget;
  auto keep_going = [&] { return keep_going_event() && clock_.Now() < deadline; };

  if (absl::Status s = LoadGlobal(m.model_version(), deadline, keep_going); !s.ok()) {
    LogWarning("task ", task_, " round ", m.round(), ": cannot get global model version ",
               m.model_version(), ": ", s.message());
    if (!absl::IsCancelled(s) && keep_going()) Send(MakePeerError(m.round(), s));
    return;
  }
  absl::StatusOr<training::TrainStats> stats = trainer_.TrainBatches(m.round_batches(), keep_going);
  params_are_global_ = false;
  if (!stats.ok()) {
    if (absl::IsCancelled(stats.status())) {
      metrics_.rounds_abandoned.Increment();
      LogInfo("task ", task_, " round ", m.round(), ": abandoned (",
              clock_.Now() >= deadline ? "deadline passed" : "superseded", "; ",
              stats.status().message(), ")");
      return;
    }
    LogError("task ", task_, " round ", m.round(), ": ", stats.status().message());
    Send(MakePeerError(m.round(), stats.status()));
    return;
  }
  metrics_.samples_trained.Increment(static_cast<double>(stats->samples));
  metrics_.train_loss.Set(stats->mean_loss);

  absl::StatusOr<tensor::FlatModel> params = trainer_.GetParameters();
  if (!params.ok()) {
    Send(MakePeerError(m.round(), params.status()));
    return;
  }
  auto delta = std::make_shared<tensor::FlatModel>();
  delta->layout = params->layout;
  delta->values.resize(params->values.size());
  const std::vector<float>& base = global_.values;
  for (size_t i = 0; i < delta->values.size(); ++i) delta->values[i] = params->values[i] - base[i];
  // Test-only: a Byzantine peer pushes a corrupted delta; what it keeps and serves is its own.
  deps_.byzantine.CorruptDelta(delta->values);
  snapshots_.Publish(Snapshot{task_, m.model_version(),
                              std::make_shared<const tensor::FlatModel>(*std::move(params))});
  const std::optional<bool> duplicate = Push(m, *stats, std::move(delta), deadline, keep_going);
  if (!duplicate) return;

  metrics_.rounds_completed.Increment();
  const double seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  metrics_.round_duration.Observe(seconds);
  LogInfo(absl::StrFormat("task %s round %d: trained %d batches, loss %.4f, %d samples, %.2f s%s",
                          task_, m.round(), stats->batches, stats->mean_loss, stats->samples,
                          seconds, *duplicate ? " (duplicate)" : ""));
}

std::optional<bool> FederatedSyncRunner::Push(const coordinator::v1::RoundStarted& m,
                                              const training::TrainStats& stats,
                                              std::shared_ptr<const tensor::FlatModel> delta,
                                              absl::Time deadline,
                                              const std::function<bool()>& keep_going) {
  aggregator::v1::UpdateMeta meta;
  meta.set_task(task_);
  meta.set_round(m.round());
  const aggregator::Caller me = Me();
  meta.set_peer_id(me.peer_id);
  meta.set_session_token(me.session_token);  // the aggregator accepts our pushes only with it
  meta.set_base_version(m.model_version());
  meta.set_num_samples(stats.samples);
  meta.set_train_loss(stats.mean_loss);
  const std::string address = aggregator_address_;
  absl::StatusOr<bool> pushed = RetryCall(deadline, keep_going, [&](absl::Time attempt_deadline) {
    return aggregator_.PushUpdate(address, meta, delta, attempt_deadline);  // shared, no copy
  });
  if (!pushed.ok()) {
    const absl::Status& s = pushed.status();
    if (absl::IsFailedPrecondition(s)) {
      metrics_.updates_rejected.Increment();
      LogWarning("task ", task_, " round ", m.round(),
                 ": update not accepted (round closed?): ", s.message());
    } else if (absl::IsInvalidArgument(s) || absl::IsNotFound(s)) {
      metrics_.updates_rejected.Increment();
      LogError("task ", task_, " round ", m.round(), ": update rejected: ", s.message());
      Send(MakePeerError(m.round(), s));
    } else {
      LogWarning("task ", task_, " round ", m.round(),
                 ": could not push the update: ", s.message());
      if (keep_going()) Send(MakePeerError(m.round(), s));
    }
    return std::nullopt;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(delta->layout.total_bytes()));
  return *pushed;
}

void FederatedSyncRunner::HandleModelPublished(const coordinator::v1::ModelPublished& m) {
  absl::Status s = LoadGlobal(m.version(), clock_.Now() + options_.model_transfer_budget,
                              [this] { return TaskCurrent(); });
  if (!s.ok()) {
    LogWarning("task ", task_, ": cannot get published model version ", m.version(), ": ",
               s.message());
    return;
  }
  PublishSnapshot(m.version());
  absl::StatusOr<training::EvalStats> eval = trainer_.Evaluate();
  if (!eval.ok()) {
    LogError("task ", task_, ": evaluating version ", m.version(), ": ", eval.status().message());
    Send(MakePeerError(m.round(), eval.status()));
    return;
  }
  metrics_.test_accuracy.Set(eval->accuracy());
  LogInfo(absl::StrFormat("task %s round %d: model version %d test accuracy %.4f (%d/%d)", task_,
                          m.round(), m.version(), eval->accuracy(), eval->correct, eval->total));
  Send(MakeEvalReport(m.version(), *eval));
}

}  // namespace shoal::peer
