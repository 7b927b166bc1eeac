#include "services/peer_agent/modes/decentralized/decentralized_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/task/task_privacy.h"
#include "services/peer_agent/reports.h"
#include "services/peer_agent/update_compression.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerEndpoint;
using coordinator::v1::PeerMessage;

}  // namespace

absl::StatusOr<std::unique_ptr<ModeRunner>> CreateDecentralizedRunner(ModeRunnerDeps deps) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<DecentralizedRunner> runner,
                         DecentralizedRunner::Create(std::move(deps)));
  return std::unique_ptr<ModeRunner>(std::move(runner));
}

absl::StatusOr<std::unique_ptr<DecentralizedRunner>> DecentralizedRunner::Create(
    ModeRunnerDeps deps, DecentralizedRunnerOptions options) {
  SHOAL_RETURN_IF_ERROR(CheckRunnerDeps(deps, common::v1::MODE_DECENTRALIZED, {.peers = true}));
  if (deps.peer_id.empty()) {
    return absl::InvalidArgumentError("the decentralized runner needs this peer's id");
  }
  if (options.probe_attempts < 1 || options.probe_timeout <= absl::ZeroDuration() ||
      options.fetch_timeout <= absl::ZeroDuration() || !(options.slowest_link > 0) ||
      options.sync_budget <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("decentralized runner options: bad timeouts or attempts");
  }
  if (task::HasSecureAggregation(deps.assigned.spec()) && deps.identity == nullptr) {
    return absl::InvalidArgumentError(
        "the decentralized runner needs an identity key for secure aggregation");
  }
  if (deps.assigned.spec().round_deadline_seconds() > 0) {
    options.sync_budget = absl::Seconds(deps.assigned.spec().round_deadline_seconds());
  }
  // Every participant aggregates the round with the task's strategy (unset: mean).
  common::v1::TaskSpec spec = deps.assigned.spec();
  if (spec.aggregation() == common::v1::AGGREGATION_UNSPECIFIED) {
    spec.set_aggregation(common::v1::AGGREGATION_MEAN);
  }
  absl::StatusOr<aggregation::Strategy> strategy = aggregation::MakeStrategy(spec);
  if (!strategy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", spec.name(), ": ", strategy.status().message()));
  }
  SHOAL_ASSIGN_OR_RETURN(UpdatePrivacy noise, UpdatePrivacy::Create(spec, CentralNoise::kAtPeer));
  return std::unique_ptr<DecentralizedRunner>(
      new DecentralizedRunner(std::move(deps), options, *std::move(strategy), std::move(noise)));
}

DecentralizedRunner::DecentralizedRunner(ModeRunnerDeps deps, DecentralizedRunnerOptions options,
                                         aggregation::Strategy strategy, UpdatePrivacy noise)
    : deps_(std::move(deps)),
      options_(options),
      strategy_(std::move(strategy)),
      noise_(std::move(noise)),
      secure_(task::HasSecureAggregation(deps_.assigned.spec())),
      task_(deps_.assigned.spec().name()),
      trainer_(*deps_.trainer),
      snapshots_(*deps_.snapshots),
      peers_(*deps_.peers),
      metrics_(*deps_.metrics),
      clock_(*deps_.clock),
      wakeup_(*deps_.wakeup),
      model_buffers_(tensor::BufferPool::Create(options_.fetch_window + 2)),
      compressor_(CompressionOf(deps_.assigned.spec())),
      kept_(deps_.state_dir, task_, deps_.assigned.created_unix_ms()) {
  if (const std::string how = DescribeCompression(compressor_); !how.empty()) {
    LogInfo("task ", task_, ": round updates are exchanged as compressed deltas: ", how);
  }
  if (noise_.enabled()) {
    LogInfo("task ", task_, ": round updates are ", noise_.Describe(),
            secure_ ? " over the masking's number of participants (privacy.dp, level peer)"
                    : " before they are served (privacy.dp, level peer)");
  }
}

void DecentralizedRunner::Send(const PeerMessage& message) { deps_.send(message); }

void DecentralizedRunner::SendError(uint64_t round, const absl::Status& status) {
  Send(MakePeerError(round, status));
}

void DecentralizedRunner::SendModelHeld() {
  PeerMessage m;
  m.mutable_model_held()->set_round(model_round_);
  m.mutable_model_held()->set_digest_xxh3(held_->Digest());
  Send(m);
}

absl::Status DecentralizedRunner::RestoreHeld() {
  if (params_are_held_) return absl::OkStatus();
  SHOAL_RETURN_IF_ERROR(trainer_.SetParameters(*held_));
  params_are_held_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> DecentralizedRunner::MakeUpdate(
    tensor::FlatModel trained, std::shared_ptr<const tensor::EncodedModel>* encoded) {
  if (!compressed()) return model_buffers_->Share(std::move(trained));
  if (!(trained.layout == held_->layout) || trained.values.size() != held_->values.size()) {
    return absl::InternalError("the trained model's layout is not the held model's");
  }
  auto delta = std::make_shared<tensor::FlatModel>(std::move(trained));
  for (size_t i = 0; i < delta->values.size(); ++i) delta->values[i] -= held_->values[i];
  round_->compressor = compressor_;
  *encoded = compressor_.Compress(std::move(delta), model_round_);
  // What every other participant decodes from the wire, so this peer folds the same values.
  SHOAL_ASSIGN_OR_RETURN(tensor::FlatModel decoded, tensor::DecodeModel(**encoded));
  return std::make_shared<const tensor::FlatModel>(std::move(decoded));
}

void DecentralizedRunner::Start() {
  if (held_->values.empty() && !HoldKeptModel()) {
    absl::StatusOr<tensor::FlatModel> init = trainer_.InitialParameters();
    absl::Status s = init.status();
    if (s.ok()) s = trainer_.SetParameters(*init);
    if (!s.ok()) {
      LogError("task ", task_, ": cannot build the initial model: ", s.message());
      SendError(0, s);
      return;
    }
    held_ = std::make_shared<const tensor::FlatModel>(*std::move(init));
    model_round_ = 0;
    params_are_held_ = true;
  }
  LogInfo(absl::StrFormat("task %s: decentralized, holding the model of round %d (digest %016x)",
                          task_, model_round_, held_->Digest()));
  SendModelHeld();
}

void DecentralizedRunner::Finished() { kept_.Forget(); }

bool DecentralizedRunner::HoldKeptModel() {
  std::optional<KeptModel::Held> kept = kept_.Load();
  if (!kept.has_value()) return false;
  if (absl::Status s = trainer_.SetParameters(kept->model); !s.ok()) {
    LogWarning("task ", task_, ": the model kept on disk for round ", kept->round,
               " is not this task's model; starting from the initial one: ", s.message());
    kept_.Forget();
    return false;
  }
  held_ = std::make_shared<const tensor::FlatModel>(std::move(kept->model));
  model_round_ = kept->round;
  params_are_held_ = true;
  PublishHeld(0, 0);  // served to peers that sync, as after a sync
  LogInfo("task ", task_, ": holding the model of round ", model_round_,
          " kept on disk before a restart (--state-dir)");
  return true;
}

void DecentralizedRunner::PublishHeld(uint64_t num_samples, double loss) {
  Snapshot global;
  global.task = task_;
  global.version = model_round_;
  global.model = held_;
  global.kind = peer::v1::SNAPSHOT_KIND_GLOBAL;
  global.round = model_round_;
  global.num_samples = num_samples;
  global.loss = loss;
  snapshots_.Publish(std::move(global));
}

void DecentralizedRunner::KeepHeld() {
  if (absl::Status s = kept_.Keep(model_round_, *held_); !s.ok()) {
    LogWarning("task ", task_, ": ", s.message(), " (a restart of this peer will not hold it)");
  }
}

bool DecentralizedRunner::Supersedes(const CoordinatorEvent& e) const {
  if (e.has_join_refused()) return !RefusesAnEarlierOffer(e.join_refused());
  return e.has_round_open() || e.has_peer_list() || e.has_start_sharing() ||
         e.has_connection_failed() || e.has_sync_from() || e.has_task_assigned() ||
         e.has_task_finished();
}

bool DecentralizedRunner::Intercept(const CoordinatorEvent& e) {
  if (e.has_round_open()) {
    absl::MutexLock lock(&offer_mu_);
    offered_round_ = e.round_open().round();
    offered_offer_ = e.round_open().offer();
  }
  return false;
}

bool DecentralizedRunner::RefusesAnEarlierOffer(const coordinator::v1::JoinRefused& m) const {
  absl::MutexLock lock(&offer_mu_);
  return m.offer() != 0 && m.round() == offered_round_ && m.offer() < offered_offer_;
}

void DecentralizedRunner::SendJoin(const coordinator::v1::RoundOpen& m) {
  PeerMessage join;
  join.mutable_join_round()->set_round(m.round());
  join.mutable_join_round()->set_offer(m.offer());
  Send(join);
}

void DecentralizedRunner::Handle(const CoordinatorEvent& e,
                                 const std::function<bool()>& keep_going) {
  switch (e.kind_case()) {
    case CoordinatorEvent::kTaskAssigned:
      // Re-assigned after a reconnect: whatever round was running is gone for the coordinator.
      if (round_ && model_round_ < round_->round) AbandonRound("re-assigned");
      round_.reset();
      SendModelHeld();
      break;
    case CoordinatorEvent::kRoundOpen:
      HandleRoundOpen(e.round_open(), keep_going);
      break;
    case CoordinatorEvent::kJoinRefused:
      if (RefusesAnEarlierOffer(e.join_refused())) {
        // Refused before a later RoundOpen of the round, which this peer answers.
        LogInfo("task ", task_, " round ", e.join_refused().round(),
                ": an earlier JoinRound was refused (", e.join_refused().reason(),
                "); the later one stands");
        break;
      }
      metrics_.decentralized.rounds_refused.Increment();
      DropCompletedRoundBefore(e.join_refused().round());
      if (round_ && round_->round <= e.join_refused().round()) {
        AbandonRound(absl::StrCat("join refused: ", e.join_refused().reason()));
      }
      break;
    case CoordinatorEvent::kConnectionFailed:
      metrics_.decentralized.rounds_refused.Increment();
      DropCompletedRoundBefore(e.connection_failed().round());
      if (round_ && round_->round <= e.connection_failed().round()) {
        AbandonRound(
            absl::StrCat("removed after failing to connect: ", e.connection_failed().reason()));
      }
      for (const PeerEndpoint& p : participants_) peers_.Forget(p.address());
      participants_.clear();
      break;
    case CoordinatorEvent::kPeerList:
      HandlePeerList(e.peer_list(), keep_going);
      break;
    case CoordinatorEvent::kStartSharing:
      if (!round_ || round_->round != e.start_sharing().round()) {
        LogWarning("task ", task_, ": StartSharing for round ", e.start_sharing().round(),
                   " which this peer is not in; ignored");
        break;
      }
      if (secure_) {
        ShareMasked(e.start_sharing().round(), e.start_sharing().attempt(), keep_going);
      } else {
        Share(e.start_sharing().round(), e.start_sharing().attempt(), keep_going);
      }
      break;
    case CoordinatorEvent::kUnmask:
      HandleUnmask(e.unmask());
      break;
    case CoordinatorEvent::kMaskReveals:
      HandleMaskReveals(e.mask_reveals());
      break;
    case CoordinatorEvent::kModelPublished:
      HandleModelPublished(e.model_published(), keep_going);
      break;
    case CoordinatorEvent::kSyncFrom:
      HandleSyncFrom(e.sync_from(), keep_going);
      break;
    case CoordinatorEvent::kSyncServe:
      LogInfo("task ", task_, ": serving the model of round ", e.sync_serve().round(), " to ",
              e.sync_serve().peer_id(), " (holding round ", model_round_, ")");
      break;
    case CoordinatorEvent::kWaiting:
      LogInfo("task ", task_, ": waiting for peers (", e.waiting().have(), " of ",
              e.waiting().need(), ")");
      break;
    default:
      LogWarning("task ", task_, ": ignoring coordinator event (field ",
                 static_cast<int>(e.kind_case()), ") in decentralized mode");
  }
}

void DecentralizedRunner::DropCompletedRoundBefore(uint64_t round) {
  if (round_ && round_->round < round && model_round_ >= round_->round) round_.reset();
}

void DecentralizedRunner::AbandonRound(const std::string& why) {
  if (round_) {
    LogInfo("task ", task_, " round ", round_->round, ": leaving the round (", why, ")");
    if (round_->progress.has_value()) {
      if (absl::Status s = trainer_.RestoreProgress(*round_->progress); !s.ok()) {
        LogError("task ", task_, ": ", s.message());
      }
    }
    if (round_->compressor.has_value()) compressor_ = *std::move(round_->compressor);
    if (model_round_ >= round_->round && round_->base != nullptr && !round_->base->values.empty()) {
      // Already averaged: go back to the model held before the round.
      held_ = std::move(round_->base);
      model_round_ = round_->round - 1;
      params_are_held_ = false;
      PublishHeld(0, 0);  // this peer holds the round before again: served to joiners
      if (kept_.kept_round() != model_round_) KeepHeld();  // and holds it after a restart
    }
  }
  round_.reset();
  snapshots_.Clear(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  if (absl::Status s = RestoreHeld(); !s.ok()) {
    LogError("task ", task_, ": cannot restore the model of round ", model_round_, ": ",
             s.message());
  }
}

void DecentralizedRunner::HandleRoundOpen(const coordinator::v1::RoundOpen& m,
                                          const std::function<bool()>& keep_going) {
  const uint64_t r = m.round();
  if (round_ && round_->round == r && round_->ready) {
    // A repeated RoundOpen (e.g. after a reconnect, or joins re-opened after this peer's
    // JoinRound was refused): answer again without training again.
    SendJoin(m);
    PeerMessage ready;
    auto* rr = ready.mutable_round_ready();
    rr->set_round(r);
    rr->set_num_samples(round_->num_samples);
    rr->set_train_loss(round_->train_loss);
    rr->set_train_ms(round_->train_ms);
    if (absl::Status s = AddMaskKey(*rr); !s.ok()) {
      SendError(r, s);
      return;
    }
    Send(ready);
    return;
  }
  if (r != model_round_ + 1) {
    LogWarning("task ", task_, ": RoundOpen for round ", r,
               " but this peer holds the model of round ", model_round_,
               "; telling the coordinator");
    SendModelHeld();
    return;
  }
  if (round_ && model_round_ >= round_->round) {
    round_.reset();  // the previous round completed here (its ModelPublished went missing)
  } else if (round_) {
    AbandonRound("a new round opened");
  }
  if (absl::Status s = RestoreHeld(); !s.ok()) {
    SendError(r, s);
    return;
  }
  round_ = RoundState{};
  round_->round = r;
  if (absl::StatusOr<training::TrainerProgress> p = trainer_.SaveProgress(); p.ok()) {
    round_->progress = *std::move(p);
  } else {
    LogWarning("task ", task_, " round ", r, ": ", p.status().message());
  }
  SendJoin(m);
  metrics_.decentralized.rounds_joined.Increment();
  // The previous round's evaluation, deferred so that JoinRound went out first.
  RunPendingEval();

  const absl::Time start = clock_.Now();
  const std::optional<absl::Time> ready_deadline =
      m.ready_deadline_unix_ms() > 0
          ? std::optional(absl::FromUnixMillis(m.ready_deadline_unix_ms()))
          : std::nullopt;
  auto train_going = [&] {
    return keep_going() && (!ready_deadline || clock_.Now() < *ready_deadline);
  };
  params_are_held_ = false;
  absl::StatusOr<training::TrainStats> stats =
      trainer_.TrainBatches(m.round_batches(), train_going);
  if (!stats.ok()) {
    if (absl::IsCancelled(stats.status())) {
      metrics_.rounds_abandoned.Increment();
      AbandonRound(keep_going() ? "missed the ready deadline" : "superseded");
      return;
    }
    LogError("task ", task_, " round ", r, ": ", stats.status().message());
    SendError(r, stats.status());
    AbandonRound("training failed");
    return;
  }
  absl::StatusOr<tensor::FlatModel> params = trainer_.GetParameters(model_buffers_->Take());
  if (!params.ok()) {
    SendError(r, params.status());
    AbandonRound("cannot read the parameters");
    return;
  }
  const int64_t train_ms = absl::ToInt64Milliseconds(clock_.Now() - start);
  metrics_.samples_trained.Increment(static_cast<double>(stats->samples));
  metrics_.train_loss.Set(stats->mean_loss);
  metrics_.round_duration.Observe(static_cast<double>(train_ms) / 1000.0);
  // A test build may tamper with what is shared (a Byzantine peer shares base + factor ·
  // (trained − base)); this peer aggregates that too, so every participant still ends the round
  // with the same model.
  if (absl::Status s = deps_.update_hooks.TamperModel(*held_, *params); !s.ok()) {
    SendError(r, s);
    AbandonRound("the update hook failed");
    return;
  }
  if (secure_) {
    // The update is served only masked, once the round's participants are known (PeerList).
    absl::StatusOr<SecureRound> secure =
        SecureRound::Start(task_, r, deps_.peer_id, task::SecureClipNorm(deps_.assigned.spec()),
                           stats->samples, *held_, *params);
    if (!secure.ok()) {
      SendError(r, secure.status());
      AbandonRound("cannot start the secure round");
      return;
    }
    round_->secure.emplace(*std::move(secure));
    round_->num_samples = stats->samples;
    round_->train_loss = stats->mean_loss;
    round_->train_ms = train_ms;
    round_->ready = true;
    LogInfo(absl::StrFormat(
        "task %s round %d: trained %d batches, loss %.4f, %d samples, %.2f s; the update is "
        "served masked once the participants are known",
        task_, r, stats->batches, stats->mean_loss, stats->samples,
        static_cast<double>(train_ms) / 1000.0));
    PeerMessage ready;
    auto* rr = ready.mutable_round_ready();
    rr->set_round(r);
    rr->set_num_samples(stats->samples);
    rr->set_train_loss(stats->mean_loss);
    rr->set_train_ms(train_ms);
    if (absl::Status s = AddMaskKey(*rr); !s.ok()) {
      SendError(r, s);
      AbandonRound("cannot sign the mask key");
      return;
    }
    Send(ready);
    return;
  }
  // privacy.dp at level peer: every other participant sees this update as served.
  if (absl::Status s = noise_.ApplyToModel(*held_, *params).status(); !s.ok()) {
    SendError(r, s);
    AbandonRound("cannot add the update's noise");
    return;
  }
  std::shared_ptr<const tensor::EncodedModel> encoded;
  absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> made =
      MakeUpdate(*std::move(params), &encoded);
  if (!made.ok()) {
    SendError(r, made.status());
    AbandonRound("cannot make the round update");
    return;
  }
  round_->update = *std::move(made);
  round_->num_samples = stats->samples;
  round_->train_loss = stats->mean_loss;
  round_->train_ms = train_ms;
  round_->ready = true;
  Snapshot update;
  update.task = task_;
  update.version = r;
  update.model = round_->update;
  update.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
  update.round = r;
  update.num_samples = stats->samples;
  update.loss = stats->mean_loss;
  const tensor::ModelLayout& layout = round_->update->layout;
  const uint64_t bytes = encoded != nullptr ? encoded->payload_bytes() : layout.total_bytes();
  const uint64_t values = encoded != nullptr ? encoded->values_sent() : layout.total_elements();
  metrics_.update_bytes_sent.Increment(static_cast<double>(bytes));
  metrics_.update_bytes_raw.Increment(static_cast<double>(layout.total_bytes()));
  update.encoded = std::move(encoded);
  snapshots_.Publish(std::move(update));
  LogInfo(absl::StrFormat(
      "task %s round %d: trained %d batches, loss %.4f, %d samples, update %d bytes (%d of %d "
      "values), %.2f s",
      task_, r, stats->batches, stats->mean_loss, stats->samples, bytes, values,
      layout.total_elements(), static_cast<double>(train_ms) / 1000.0));
  PeerMessage ready;
  auto* rr = ready.mutable_round_ready();
  rr->set_round(r);
  rr->set_num_samples(stats->samples);
  rr->set_train_loss(stats->mean_loss);
  rr->set_train_ms(train_ms);
  Send(ready);
}

void DecentralizedRunner::HandleModelPublished(const coordinator::v1::ModelPublished& m,
                                               const std::function<bool()>& keep_going) {
  if (model_round_ != m.version()) {
    LogWarning("task ", task_, ": ModelPublished version ", m.version(),
               " but this peer holds the model of round ", model_round_, "; not evaluated");
    return;
  }
  if (round_ && round_->round <= m.round()) round_.reset();  // the round is complete
  snapshots_.DropGlobalsBefore(m.round());  // joiners are sent for this round from now on
  // Kept when it was aggregated or synced; again only if writing it failed then.
  if (kept_.kept_round() != model_round_) KeepHeld();
  if (absl::Status s = RestoreHeld(); !s.ok()) {
    SendError(m.round(), s);
    return;
  }
  // The coordinator sends the next RoundOpen right behind ModelPublished: give it a moment to
  // arrive, so that every peer makes the same choice (an evaluation before training would make
  // this peer the round's straggler).
  if (m.round() < deps_.assigned.spec().rounds()) {
    wakeup_.SleepFor(options_.next_round_grace, keep_going);
  }
  if (!keep_going()) {
    // The next round is already open: answer it with JoinRound first (a JoinRound after the
    // first RoundReady would be refused), then evaluate this model, then train.
    pending_eval_ = PendingEval{m.round(), m.version(), held_};
    LogInfo("task ", task_, " round ", m.round(),
            ": the next round is open; evaluating this model after joining it");
    return;
  }
  pending_eval_.reset();
  EvaluateAndReport(m.round(), m.version());
}

void DecentralizedRunner::RunPendingEval() {
  if (!pending_eval_) return;
  PendingEval pending = *std::move(pending_eval_);
  pending_eval_.reset();
  // The parameters are kept aside in a pooled buffer, which goes back to the pool after.
  absl::StatusOr<tensor::FlatModel> current = trainer_.GetParameters(model_buffers_->Take());
  absl::Status s = current.status();
  if (s.ok()) s = trainer_.SetParameters(*pending.model);
  if (!s.ok()) {
    LogWarning("task ", task_, ": cannot evaluate round ", pending.round, ": ", s.message());
    return;
  }
  EvaluateAndReport(pending.round, pending.version);
  if (absl::Status r = trainer_.SetParameters(*current); !r.ok()) {
    LogError("task ", task_, ": cannot restore the parameters after evaluating: ", r.message());
  }
  model_buffers_->Give(std::move(current->values));
}

void DecentralizedRunner::EvaluateAndReport(uint64_t round, uint64_t version) {
  absl::StatusOr<training::EvalStats> eval = trainer_.Evaluate();
  if (!eval.ok()) {
    LogError("task ", task_, ": evaluating round ", round, ": ", eval.status().message());
    SendError(round, eval.status());
    return;
  }
  metrics_.test_accuracy.Set(eval->accuracy());
  LogInfo(absl::StrFormat("task %s round %d: model test accuracy %.4f (%d/%d)", task_, round,
                          eval->accuracy(), eval->correct, eval->total));
  Send(MakeEvalReport(version, *eval));
}

}  // namespace shoal::peer
