#include "services/peer_agent/modes/federated_sync/federated_sync_runner.h"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/heap.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/retry.h"
#include "libs/task/task_privacy.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/secure_participant.h"
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
  std::unique_ptr<BackgroundEvaluator> evaluator;
  if (deps.evaluate_beside_training) {
    SHOAL_ASSIGN_OR_RETURN(evaluator,
                           BackgroundEvaluator::Create(*deps.trainer, deps.assigned.spec().name(),
                                                       *deps.metrics, deps.send));
  }
  return std::unique_ptr<FederatedSyncRunner>(
      new FederatedSyncRunner(std::move(deps), std::move(options), std::move(evaluator)));
}

absl::StatusOr<std::unique_ptr<ModeRunner>> CreateFederatedSyncRunner(ModeRunnerDeps deps) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<FederatedSyncRunner> runner,
                         FederatedSyncRunner::Create(std::move(deps)));
  return std::unique_ptr<ModeRunner>(std::move(runner));
}

FederatedSyncRunner::FederatedSyncRunner(ModeRunnerDeps deps, FederatedSyncOptions options,
                                         std::unique_ptr<BackgroundEvaluator> evaluator)
    : deps_(std::move(deps)),
      options_(std::move(options)),
      task_(deps_.assigned.spec().name()),
      trainer_(*deps_.trainer),
      snapshots_(*deps_.snapshots),
      aggregator_(*deps_.aggregator),
      metrics_(*deps_.metrics),
      clock_(*deps_.clock),
      peer_(deps_, {options_.rpc_timeout, options_.retry_backoff, options_.slowest_link}),
      evaluator_(std::move(evaluator)) {}

void FederatedSyncRunner::Send(const PeerMessage& message) const { deps_.send(message); }

bool FederatedSyncRunner::Supersedes(const CoordinatorEvent& e) const {
  return e.has_round_started() || e.has_model_published() || e.has_task_finished() ||
         e.has_task_assigned();
}

void FederatedSyncRunner::Start() {
  LogInfo("task ", task_, ": federated-sync through the aggregator at ",
          peer_.address().empty() ? std::string("(none yet)") : peer_.address());
}

void FederatedSyncRunner::Handle(const CoordinatorEvent& e,
                                 const std::function<bool()>& keep_going) {
  switch (e.kind_case()) {
    case CoordinatorEvent::kTaskAssigned:
      peer_.Reassign(e.task_assigned().aggregator_address());
      break;
    case CoordinatorEvent::kInitializeModel:
      peer_.UploadInitialModel(e.initialize_model(), options_.model_transfer_budget);
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

void FederatedSyncRunner::HandleRoundStarted(const coordinator::v1::RoundStarted& m,
                                             const std::function<bool()>& keep_going_event) {
  const absl::Time start = clock_.Now();
  const absl::Time deadline = m.deadline_unix_ms() > 0 ? absl::FromUnixMillis(m.deadline_unix_ms())
                                                       : start + options_.default_round_budget;
  auto keep_going = [&] { return keep_going_event() && clock_.Now() < deadline; };

  // While it trains the peer serves no snapshot: the memory goes to LibTorch's parameters,
  // gradients and momentum (the global model is at the aggregator, the peer's copy on disk).
  snapshots_.Clear(peer::v1::SNAPSHOT_KIND_LATEST);
  peer_.UseAggregators(m.aggregators());
  if (absl::Status s = peer_.LoadGlobal(m.model_version(), deadline, keep_going); !s.ok()) {
    LogWarning("task ", task_, " round ", m.round(), ": cannot get global model version ",
               m.model_version(), ": ", s.message());
    if (!absl::IsCancelled(s) && keep_going()) Send(MakePeerError(m.round(), s));
    return;
  }
  // An evaluation of the last published model beside training stops and lets go of its model
  // until the round's training, delta and push are done (BackgroundEvaluator): they have the
  // memory.
  if (evaluator_ != nullptr) evaluator_->Pause();
  absl::Cleanup pushed = [this] {
    if (evaluator_ != nullptr) evaluator_->Resume();
  };
  absl::StatusOr<training::TrainStats> stats = trainer_.TrainBatches(m.round_batches(), keep_going);
  peer_.Trained();
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

  // What training freed (gradients, activations) goes back before the copy for the delta is
  // made, so that copy does not come on top of it.
  ReturnFreeMemory();
  // The delta is computed in place in the one copy of the parameters.
  absl::StatusOr<tensor::FlatModel> params = trainer_.GetState(/*include_buffers=*/true);
  absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> delta =
      params.ok() ? peer_.DeltaOf(*std::move(params), m.expected_peers()) : params.status();
  if (!delta.ok()) {
    LogError("task ", task_, " round ", m.round(), ": ", delta.status().message());
    Send(MakePeerError(m.round(), delta.status()));
    return;
  }
  const uint64_t sent = (*delta)->payload_bytes();
  const uint64_t values = (*delta)->values_sent();
  const uint64_t all_values = (*delta)->layout.total_elements();
  const std::optional<bool> duplicate =
      task::HasSecureAggregation(deps_.assigned.spec())
          ? SecurePush(m, *stats, **delta, deadline, keep_going)
          : Push(m, *stats, *std::move(delta), deadline, keep_going);
  if (!duplicate) return;

  metrics_.rounds_completed.Increment();
  const double seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  metrics_.round_duration.Observe(seconds);
  LogInfo(absl::StrFormat(
      "task %s round %d: trained %d batches, loss %.4f, %d samples, pushed %d bytes (%d of %d "
      "values), %.2f s%s",
      task_, m.round(), stats->batches, stats->mean_loss, stats->samples, sent, values, all_values,
      seconds, *duplicate ? " (duplicate)" : ""));
}

std::optional<bool> FederatedSyncRunner::Push(const coordinator::v1::RoundStarted& m,
                                              const training::TrainStats& stats,
                                              std::shared_ptr<const tensor::EncodedModel> delta,
                                              absl::Time deadline,
                                              const std::function<bool()>& keep_going) {
  aggregator::v1::UpdateMeta meta;
  meta.set_task(task_);
  meta.set_round(m.round());
  const aggregator::Caller me = peer_.Me();
  meta.set_peer_id(me.peer_id);
  meta.set_session_token(me.session_token);  // the aggregator accepts our pushes only with it
  meta.set_base_version(m.model_version());
  meta.set_num_samples(stats.samples);
  meta.set_train_loss(stats.mean_loss);
  meta.set_train_ms(absl::ToInt64Milliseconds(stats.duration));
  // With backups (replicas), an attempt that finds one unavailable is retried at the next.
  size_t attempt = 0;
  absl::StatusOr<bool> pushed = peer_.RetryCall(
      deadline, keep_going,
      [&](absl::Time attempt_deadline) {
        const std::string& address = peer_.AddressFor(attempt++);
        absl::StatusOr<bool> pushed =
            aggregator_.PushUpdate(address, meta, delta, attempt_deadline);  // shared, no copy
        if (!pushed.ok() && rpc::IsTransient(pushed.status())) {
          LogWarning("task ", task_, " round ", m.round(), ": push attempt ", attempt, " at ",
                     address, ": ", pushed.status().message(),
                     " (retried while the round's deadline allows)");
        }
        return pushed;
      },
      delta->payload_bytes());
  if (!pushed.ok()) {
    const absl::Status& s = pushed.status();
    if (absl::IsFailedPrecondition(s)) {
      metrics_.updates_rejected.Increment();
      LogWarning("task ", task_, " round ", m.round(),
                 ": update not accepted (round closed?): ", s.message());
    } else if (absl::IsNotFound(s)) {
      // The aggregator does not run the round (it restarted and lost the task, or the task
      // moved): the coordinator sees that too and starts the round again where the task is.
      // Not this peer's failure, so not reported (a report takes the peer out of the task).
      metrics_.updates_rejected.Increment();
      LogWarning("task ", task_, " round ", m.round(),
                 ": update not accepted (the aggregator does not run the round): ", s.message());
    } else if (absl::IsInvalidArgument(s)) {
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
  metrics_.bytes_sent.Increment(static_cast<double>(delta->payload_bytes()));
  metrics_.update_bytes_sent.Increment(static_cast<double>(delta->payload_bytes()));
  metrics_.update_bytes_raw.Increment(static_cast<double>(delta->layout.total_bytes()));
  return *pushed;
}

std::optional<bool> FederatedSyncRunner::SecurePush(const coordinator::v1::RoundStarted& m,
                                                    const training::TrainStats& stats,
                                                    const tensor::EncodedModel& delta,
                                                    absl::Time deadline,
                                                    const std::function<bool()>& keep_going) {
  const aggregator::Caller me = peer_.Me();
  auto own = m.identity_keys().find(me.peer_id);
  absl::Status refused;
  if (deps_.identity == nullptr) {
    refused = absl::FailedPreconditionError("this peer has no identity key");
  } else if (own == m.identity_keys().end() || own->second != deps_.identity_public_key) {
    refused = absl::FailedPreconditionError(
        "the coordinator did not list this peer's identity key for the round");
  }
  absl::StatusOr<tensor::FlatModel> update = tensor::DecodeModel(delta);
  if (refused.ok() && !update.ok()) refused = update.status();
  if (!refused.ok()) {
    LogError("task ", task_, " round ", m.round(), ": secure aggregation: ", refused.message());
    Send(MakePeerError(m.round(), refused));
    return std::nullopt;
  }
  aggregator::SecureContribution contribution;
  contribution.peer_id = me.peer_id;
  contribution.signer = deps_.identity;
  contribution.identity_keys.insert(m.identity_keys().begin(), m.identity_keys().end());
  contribution.base_version = m.model_version();
  contribution.update_view = update->values;  // read in place by every attempt
  contribution.buffers = &secure_buffers_;
  contribution.noise_stddev = peer_.UpdateNoiseStddev(m.expected_peers());
  contribution.num_samples = stats.samples;
  contribution.train_loss = stats.mean_loss;
  contribution.train_ms = absl::ToInt64Milliseconds(stats.duration);
  // With backups (replicas), an aggregator that is unavailable (lost, its stream broken, or a
  // backup not promoted yet) is retried at the next. Each attempt is a new participant: fresh
  // keys and masks, nothing of an abandoned attempt's secrets is used again. An aggregator this
  // peer sent keys to is never tried again this round: one aggregator never gets two runs over
  // the same update (their survivors' sums could differ by one peer's update). A stream lasts as
  // long as the round's steps: every attempt has the whole budget.
  const absl::Time end = deadline + options_.secure_steps_budget;
  std::optional<aggregator::SecureParticipant> party;
  std::set<std::string> keyed;  // the aggregators this peer advertised keys to this round
  size_t attempt = 0;
  absl::Status s = peer_.RetryCall(end, keep_going, [&](absl::Time) -> absl::Status {
    for (size_t k = 0; k < peer_.aggregator_count() && keyed.count(peer_.AddressFor(attempt)) > 0;
         ++k) {
      ++attempt;
    }
    const std::string& address = peer_.AddressFor(attempt);
    if (keyed.count(address) > 0) {
      return absl::FailedPreconditionError(
          "this peer took part at each aggregator of its cluster already this round");
    }
    if (attempt++ > 0) {
      LogInfo("task ", task_, " round ", m.round(), ": secure aggregation: trying ", address,
              " with fresh keys");
    }
    party.emplace(contribution);
    absl::Status done = aggregator_.SecureAggregate(address, task_, m.round(), me, *party, end);
    if (party->started()) keyed.insert(address);
    return done;
  });
  if (!s.ok()) {
    // The round goes on (or fails and runs again) without this update; the coordinator knows.
    metrics_.updates_rejected.Increment();
    LogWarning("task ", task_, " round ", m.round(), ": secure aggregation: ", s.message());
    return std::nullopt;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(4 * delta.layout.total_elements()));
  LogInfo("task ", task_, " round ", m.round(), ": secure aggregation done, ",
          party->survivors().size(), " updates in the sum");
  return false;
}

void FederatedSyncRunner::HandleModelPublished(const coordinator::v1::ModelPublished& m) {
  if (absl::Status s = peer_.LoadGlobal(
          m.version(), peer_.TransferDeadline(options_.model_transfer_budget, peer_.ModelBytes()),
          [this] { return peer_.TaskCurrent(); });
      !s.ok()) {
    LogWarning("task ", task_, ": cannot get published model version ", m.version(), ": ",
               s.message());
    return;
  }
  if (evaluator_ == nullptr) {
    // Evaluated first, then published, before the next round: the snapshot's copy of the model
    // and the evaluation's activations are not held at once, and the next round's training
    // takes the copy down (at most 3x the model), at the cost of the evaluation's time in the
    // round.
    const absl::StatusOr<training::EvalStats> eval = trainer_.Evaluate();
    peer_.PublishSnapshot(m.version());
    ReportEvaluation(task_, m.round(), m.version(), eval, metrics_, deps_.send);
    return;
  }
  // Evaluated on the evaluator's thread: the worker goes on to the next round's RoundStarted
  // (which follows the publish at once), and the evaluation fills the time the round spends on
  // the links. It evaluates the snapshot's copy until training takes the snapshot down, then the
  // model as held on disk. The copy is made once the evaluation before has ended (it holds a
  // model of its own while it goes on), so a peer holds no more than one model beside its
  // parameters and momentum. Where an evaluation takes longer than a round leaves it (the wait
  // for the round's other peers and the download), the worker waits for it here, and logs it.
  if (const absl::Duration waited = evaluator_->WaitUntilDone(); waited > absl::ZeroDuration()) {
    metrics_.evaluation_wait.Increment(absl::ToDoubleSeconds(waited));
    LogInfo(
        absl::StrFormat("task %s: version %d waited %.2f s for the evaluation of the one before",
                        task_, m.version(), absl::ToDoubleSeconds(waited)));
  }
  std::shared_ptr<const tensor::FlatModel> model = peer_.PublishSnapshot(m.version());
  std::optional<ModelOnDisk> on_disk = peer_.HeldOnDisk();
  if (!model || !on_disk || on_disk->version != m.version()) {
    const absl::Status s = absl::InternalError(
        absl::StrCat("cannot copy model version ", m.version(), " for its evaluation"));
    LogError("task ", task_, ": ", s.message());
    Send(MakePeerError(m.round(), s));
    return;
  }
  evaluator_->Submit(m.round(), m.version(), model, *std::move(on_disk));
}

}  // namespace shoal::peer
