#include "services/peer_agent/peer_agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/tensor/frame_codec.h"
#include "services/peer_agent/decentralized_runner.h"
#include "services/peer_agent/gossip_runner.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;

bool Supersedes(const CoordinatorEvent& e) {
  return e.has_round_started() || e.has_model_published() || e.has_task_finished() ||
         e.has_task_assigned();
}

bool EndsTask(const CoordinatorEvent& e) { return e.has_task_finished() || e.has_task_assigned(); }

// The task an event is about ("" for Welcome).
const std::string& EventTask(const CoordinatorEvent& e) {
  return e.has_task_assigned() ? e.task_assigned().spec().name() : e.task();
}

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s);
}

}  // namespace

absl::Status PeerAgentOptions::Validate() const {
  if (absl::Status s = training::ValidateShardSpec(shard); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard: ", s.message()));
  }
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("device must be cpu or cuda, got ", device));
  }
  if (rpc_timeout <= absl::ZeroDuration() || model_transfer_budget <= absl::ZeroDuration() ||
      default_round_budget <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }
  if (max_queued_events == 0) return absl::InvalidArgumentError("max_queued_events must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PeerAgent>> PeerAgent::Create(
    PeerAgentOptions options, std::shared_ptr<const training::RawDataset> train,
    std::shared_ptr<const training::RawDataset> test, aggregator::AggregatorClient& aggregator,
    PeerClient& peers, SnapshotStore& snapshots, PeerMetrics& metrics, const Clock& clock,
    SendFn send, FatalFn fatal) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  if (!train || !test || train->count == 0 || test->count == 0) {
    return absl::InvalidArgumentError("the peer agent needs a non-empty training and test set");
  }
  if (!send) return absl::InvalidArgumentError("the peer agent needs a send function");
  return std::unique_ptr<PeerAgent>(
      new PeerAgent(std::move(options), std::move(train), std::move(test), aggregator, peers,
                    snapshots, metrics, clock, std::move(send), std::move(fatal)));
}

PeerAgent::PeerAgent(PeerAgentOptions options, std::shared_ptr<const training::RawDataset> train,
                     std::shared_ptr<const training::RawDataset> test,
                     aggregator::AggregatorClient& aggregator, PeerClient& peers,
                     SnapshotStore& snapshots, PeerMetrics& metrics, const Clock& clock,
                     SendFn send, FatalFn fatal)
    : options_(std::move(options)),
      train_(std::move(train)),
      test_(std::move(test)),
      aggregator_(aggregator),
      peers_(peers),
      snapshots_(snapshots),
      metrics_(metrics),
      clock_(clock),
      send_(std::move(send)),
      fatal_(std::move(fatal)) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

PeerAgent::~PeerAgent() { Stop(); }

void PeerAgent::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

aggregator::Caller PeerAgent::Me() const {
  absl::MutexLock lock(&mu_);
  return aggregator::Caller{peer_id_, session_token_};
}

std::string PeerAgent::peer_id() const {
  absl::MutexLock lock(&mu_);
  return peer_id_;
}

void PeerAgent::OnEvent(const CoordinatorEvent& event) {
  if (event.has_welcome()) {
    absl::MutexLock lock(&mu_);
    peer_id_ = event.welcome().peer_id();
    session_token_ = event.welcome().session_token();
    return;
  }
  const bool ends_task = EndsTask(event);
  bool superseding = ends_task || Supersedes(event);
  {
    // Events of the runner's task go through it first (it may consume them, and it decides
    // what stops its current work). Only this (reader) thread enqueues, so event order holds.
    absl::MutexLock runner_lock(&runner_mu_);
    if (runner_ != nullptr && EventTask(event) == runner_task_) {
      if (!ends_task && runner_->Intercept(event)) return;
      superseding = ends_task || runner_->Supersedes(event);
    }
  }
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= options_.max_queued_events) {
    // The coordinator sends a handful of events per round; this only guards against a flood.
    LogWarning("event queue full (", queue_.size(), " events); dropping an event");
    return;
  }
  if (superseding) ++queued_superseding_;
  if (ends_task) ++queued_task_ending_;
  queue_.push_back(Event{false, event, superseding, ends_task});
}

void PeerAgent::OnDisconnected() {
  absl::MutexLock lock(&mu_);
  ++queued_superseding_;
  ++queued_task_ending_;
  queue_.push_back(Event{true, {}, true, true});
}

bool PeerAgent::NotSuperseded() {
  absl::MutexLock lock(&mu_);
  return !stopping_ && queued_superseding_ == 0;
}

bool PeerAgent::TaskStillCurrent() {
  absl::MutexLock lock(&mu_);
  return !stopping_ && queued_task_ending_ == 0;
}

void PeerAgent::WorkerLoop() {
  while (true) {
    Event event;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PeerAgent* a)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->mu_) { return a->stopping_ || !a->queue_.empty(); },
          this));
      if (stopping_) break;
      event = std::move(queue_.front());
      queue_.pop_front();
      if (event.superseding) --queued_superseding_;
      if (event.ends_task) --queued_task_ending_;
    }
    Handle(event);
  }
  EndRunner();  // runners are destroyed on the worker, before the task's trainer
}

std::shared_ptr<ModeRunner> PeerAgent::runner() {
  absl::MutexLock lock(&runner_mu_);
  return runner_;
}

void PeerAgent::EndRunner() {
  std::shared_ptr<ModeRunner> old;
  {
    absl::MutexLock lock(&runner_mu_);
    old = std::move(runner_);
    runner_ = nullptr;
    runner_task_.clear();
  }
  old.reset();  // here, on the worker; the reader never keeps a reference
}

void PeerAgent::StartRunner() {
  const coordinator::v1::TaskAssigned& assigned = task_->assigned;
  const std::string& name = assigned.spec().name();
  ModeRunnerDeps deps;
  deps.assigned = assigned;
  deps.trainer = task_->trainer.get();
  deps.snapshots = &snapshots_;
  deps.peers = &peers_;
  deps.metrics = &metrics_;
  deps.clock = &clock_;
  deps.peer_id = peer_id();
  deps.send = [this](const PeerMessage& m) { Send(m); };
  absl::StatusOr<std::unique_ptr<ModeRunner>> made = absl::InternalError("no runner");
  switch (assigned.spec().mode()) {
    case common::v1::MODE_DECENTRALIZED: {
      absl::StatusOr<std::unique_ptr<DecentralizedRunner>> r =
          DecentralizedRunner::Create(std::move(deps));
      if (r.ok()) {
        made = std::unique_ptr<ModeRunner>(*std::move(r));
      } else {
        made = r.status();
      }
      break;
    }
    case common::v1::MODE_GOSSIP: {
      std::unique_ptr<ModeRunner> r = MakeGossipRunner(std::move(deps));
      if (r != nullptr) {
        made = std::move(r);
      } else {
        made = absl::InvalidArgumentError("cannot create the gossip runner");
      }
      break;
    }
    default:
      return;  // federated: no runner
  }
  if (!made.ok()) {
    absl::Status error(made.status().code(),
                       absl::StrCat("task ", name, ": ", made.status().message()));
    LogError(error.message());
    SendPeerError(name, 0, error);
    return;
  }
  std::shared_ptr<ModeRunner> runner = *std::move(made);
  {
    absl::MutexLock lock(&runner_mu_);
    runner_ = runner;
    runner_task_ = name;
  }
  runner->Start();
}

void PeerAgent::Handle(const Event& e) {
  if (e.disconnected) {
    // Keep the task and its trainer: the coordinator usually re-assigns the same task after the
    // reconnect, and then nothing needs reloading. The current round (if any) was abandoned.
    return;
  }
  const CoordinatorEvent& ev = e.event;
  if (!ev.has_task_assigned() && !ev.has_task_finished()) {
    if (std::shared_ptr<ModeRunner> r = runner(); r != nullptr) {
      if (task_ && EventTask(ev) == task_->assigned.spec().name()) {
        r->Handle(ev, [this] { return NotSuperseded(); });
      } else {
        LogWarning("ignoring an event for task ", EventTask(ev), " which this peer does not run");
      }
      return;
    }
  }
  switch (ev.kind_case()) {
    case CoordinatorEvent::kTaskAssigned:
      HandleTaskAssigned(ev.task_assigned());
      break;
    case CoordinatorEvent::kInitializeModel:
      HandleInitializeModel(ev.task());
      break;
    case CoordinatorEvent::kRoundStarted:
      HandleRoundStarted(ev.task(), ev.round_started());
      break;
    case CoordinatorEvent::kModelPublished:
      HandleModelPublished(ev.task(), ev.model_published());
      break;
    case CoordinatorEvent::kWaiting:
      LogInfo("task ", ev.task(), ": waiting for peers (", ev.waiting().have(), " of ",
              ev.waiting().need(), ")");
      break;
    case CoordinatorEvent::kTaskFinished:
      HandleTaskFinished(ev.task(), ev.task_finished());
      break;
    default:
      LogWarning("ignoring an unknown coordinator event (field ", static_cast<int>(ev.kind_case()),
                 ")");
  }
}

void PeerAgent::Send(const PeerMessage& message) {
  absl::Status s = send_(message);
  if (!s.ok()) {
    // The session is down; the coordinator treats the missing message like a straggler.
    LogWarning("could not send to the coordinator: ", s.message());
  }
}

void PeerAgent::SendPeerError(const std::string& task, uint64_t round, const absl::Status& status) {
  PeerMessage m;
  m.set_task(task);
  m.mutable_error()->set_round(round);
  m.mutable_error()->set_message(std::string(status.message()));
  Send(m);
}

void PeerAgent::PublishSnapshot(uint64_t version) {
  absl::StatusOr<tensor::FlatModel> params = task_->trainer->GetParameters();
  if (!params.ok()) return;
  snapshots_.Publish(Snapshot{task_->assigned.spec().name(), version,
                              std::make_shared<const tensor::FlatModel>(*std::move(params))});
}

template <typename T>
absl::StatusOr<T> PeerAgent::Retry(absl::Time deadline, const std::function<bool()>& keep_going,
                                   const std::function<absl::StatusOr<T>(absl::Time)>& attempt) {
  Backoff backoff(options_.retry_backoff);
  while (true) {
    absl::Time attempt_deadline = std::min(deadline, clock_.Now() + options_.rpc_timeout);
    absl::StatusOr<T> result = attempt(attempt_deadline);
    if (result.ok() || !Retryable(result.status())) return result;
    absl::Duration delay = backoff.Next();
    if (clock_.Now() + delay >= deadline || !keep_going()) return result;
    // Sleep, but wake early when stopping.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), delay);
    if (stopping_) return result;
  }
}

void PeerAgent::HandleTaskAssigned(const coordinator::v1::TaskAssigned& m) {
  const std::string& name = m.spec().name();
  if (task_ && task_->assigned.spec().SerializeAsString() == m.spec().SerializeAsString()) {
    task_->assigned.set_aggregator_address(m.aggregator_address());
    if (std::shared_ptr<ModeRunner> r = runner(); r != nullptr) {
      LogInfo("task ", name, ": assigned again");
      CoordinatorEvent again;
      *again.mutable_task_assigned() = m;
      r->Handle(again, [this] { return NotSuperseded(); });
      return;
    }
    LogInfo("task ", name, ": assigned again (aggregator ", m.aggregator_address(), ")");
    return;
  }
  EndRunner();
  task_.reset();
  snapshots_.Clear();
  if (absl::Status s = training::CheckModelName(m.spec().model()); !s.ok()) {
    absl::Status error = absl::InvalidArgumentError(
        absl::StrCat("task ", name, " cannot run on this peer: ", s.message()));
    LogError(error.message());
    SendPeerError(name, 0, error);
    if (fatal_) fatal_(error);
    return;
  }
  training::TrainerOptions trainer_options;
  trainer_options.spec = m.spec();
  trainer_options.shard = options_.shard;
  trainer_options.device = options_.device;
  const absl::Time start = clock_.Now();
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(trainer_options, *train_, *test_);
  if (!trainer.ok()) {
    absl::Status error = absl::Status(
        trainer.status().code(),
        absl::StrCat("task ", name, ": cannot set up training: ", trainer.status().message()));
    LogError(error.message());
    SendPeerError(name, 0, error);
    return;
  }
  TaskState state;
  state.assigned = m;
  state.trainer = *std::move(trainer);
  LogInfo(absl::StrFormat(
      "task %s: assigned (model %s, shard %s: %d training / %d test samples, aggregator %s, "
      "set up in %.2f s)",
      name, m.spec().model(), options_.shard.ToString(), state.trainer->train_size(),
      state.trainer->test_size(),
      m.aggregator_address().empty() ? std::string("none") : m.aggregator_address(),
      absl::ToDoubleSeconds(clock_.Now() - start)));
  task_ = std::move(state);
  StartRunner();
}

void PeerAgent::HandleInitializeModel(const std::string& task) {
  if (!task_ || task_->assigned.spec().name() != task) {
    LogWarning("InitializeModel for task ", task, " which this peer does not have; ignored");
    return;
  }
  absl::StatusOr<tensor::FlatModel> init = task_->trainer->InitialParameters();
  absl::Status status = init.status();
  std::shared_ptr<const tensor::FlatModel> model;
  if (status.ok()) {
    model = std::make_shared<const tensor::FlatModel>(*std::move(init));
    const common::v1::ModelMeta meta = tensor::MakeModelMeta(task, 0, *model);
    const std::string address = task_->assigned.aggregator_address();
    absl::StatusOr<uint64_t> put = Retry<uint64_t>(
        clock_.Now() + options_.model_transfer_budget, [this] { return TaskStillCurrent(); },
        [&](absl::Time deadline) {
          return aggregator_.PutModel(address, meta, model, Me(), deadline);
        });
    status = put.status();
  }
  if (!status.ok()) {
    LogError("task ", task, ": could not upload the initial model: ", status.message());
    SendPeerError(task, 0, status);
    return;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(model->layout.total_bytes()));
  if (absl::Status s = task_->trainer->SetParameters(*model); !s.ok()) {
    LogError("task ", task, ": ", s.message());
  }
  const uint64_t digest = model->Digest();
  task_->global_version = 0;
  task_->global = *model;
  task_->params_are_global = true;
  PublishSnapshot(0);
  LogInfo(absl::StrFormat("task %s: initial model uploaded (%d parameters, digest %016x)", task,
                          task_->global.values.size(), digest));
  PeerMessage out;
  out.set_task(task);
  out.mutable_model_initialized()->set_digest_xxh3(digest);
  Send(out);
}

absl::Status PeerAgent::LoadGlobal(uint64_t version, absl::Time deadline,
                                   const std::function<bool()>& keep_going) {
  if (task_->global_version == version) {
    if (!task_->params_are_global) {
      SHOAL_RETURN_IF_ERROR(task_->trainer->SetParameters(task_->global));
      task_->params_are_global = true;
    }
    return absl::OkStatus();
  }
  const std::string task = task_->assigned.spec().name();
  const std::string address = task_->assigned.aggregator_address();
  SHOAL_ASSIGN_OR_RETURN(
      tensor::FlatModel model,
      Retry<tensor::FlatModel>(deadline, keep_going, [&](absl::Time attempt_deadline) {
        return aggregator_.GetModel(address, task, version, Me(), attempt_deadline);
      }));
  metrics_.bytes_received.Increment(static_cast<double>(model.layout.total_bytes()));
  SHOAL_RETURN_IF_ERROR(task_->trainer->SetParameters(model));
  task_->global_version = version;
  task_->global = std::move(model);
  task_->params_are_global = true;
  return absl::OkStatus();
}

void PeerAgent::HandleRoundStarted(const std::string& task,
                                   const coordinator::v1::RoundStarted& m) {
  if (!task_ || task_->assigned.spec().name() != task) {
    LogWarning("RoundStarted for task ", task, " which this peer does not have; ignored");
    return;
  }
  const absl::Time start = clock_.Now();
  const absl::Time deadline = m.deadline_unix_ms() > 0 ? absl::FromUnixMillis(m.deadline_unix_ms())
                                                       : start + options_.default_round_budget;
  auto keep_going = [this, deadline] { return NotSuperseded() && clock_.Now() < deadline; };

  if (absl::Status s = LoadGlobal(m.model_version(), deadline, keep_going); !s.ok()) {
    LogWarning("task ", task, " round ", m.round(), ": cannot get global model version ",
               m.model_version(), ": ", s.message());
    if (!absl::IsCancelled(s) && keep_going()) SendPeerError(task, m.round(), s);
    return;
  }
  absl::StatusOr<training::TrainStats> stats =
      task_->trainer->TrainBatches(m.round_batches(), keep_going);
  task_->params_are_global = false;
  if (!stats.ok()) {
    if (absl::IsCancelled(stats.status())) {
      metrics_.rounds_abandoned.Increment();
      LogInfo("task ", task, " round ", m.round(), ": abandoned (",
              clock_.Now() >= deadline ? "deadline passed" : "superseded", "; ",
              stats.status().message(), ")");
      return;
    }
    LogError("task ", task, " round ", m.round(), ": ", stats.status().message());
    SendPeerError(task, m.round(), stats.status());
    return;
  }
  metrics_.samples_trained.Increment(static_cast<double>(stats->samples));
  metrics_.train_loss.Set(stats->mean_loss);

  absl::StatusOr<tensor::FlatModel> params = task_->trainer->GetParameters();
  if (!params.ok()) {
    SendPeerError(task, m.round(), params.status());
    return;
  }
  auto delta = std::make_shared<tensor::FlatModel>();
  delta->layout = params->layout;
  delta->values.resize(params->values.size());
  const std::vector<float>& base = task_->global.values;
  for (size_t i = 0; i < delta->values.size(); ++i) delta->values[i] = params->values[i] - base[i];
  snapshots_.Publish(Snapshot{task, m.model_version(),
                              std::make_shared<const tensor::FlatModel>(*std::move(params))});

  aggregator::v1::UpdateMeta meta;
  meta.set_task(task);
  meta.set_round(m.round());
  {
    absl::MutexLock lock(&mu_);
    meta.set_peer_id(peer_id_);
    meta.set_session_token(session_token_);  // the aggregator accepts our pushes only with it
  }
  meta.set_base_version(m.model_version());
  meta.set_num_samples(stats->samples);
  meta.set_train_loss(stats->mean_loss);
  const std::string address = task_->assigned.aggregator_address();
  absl::StatusOr<bool> pushed = Retry<bool>(deadline, keep_going, [&](absl::Time attempt_deadline) {
    return aggregator_.PushUpdate(address, meta, delta, attempt_deadline);  // shared, no copy
  });
  if (!pushed.ok()) {
    const absl::Status& s = pushed.status();
    if (absl::IsFailedPrecondition(s)) {
      metrics_.updates_rejected.Increment();
      LogWarning("task ", task, " round ", m.round(),
                 ": update not accepted (round closed?): ", s.message());
    } else if (absl::IsInvalidArgument(s) || absl::IsNotFound(s)) {
      metrics_.updates_rejected.Increment();
      LogError("task ", task, " round ", m.round(), ": update rejected: ", s.message());
      SendPeerError(task, m.round(), s);
    } else {
      LogWarning("task ", task, " round ", m.round(), ": could not push the update: ", s.message());
      if (keep_going()) SendPeerError(task, m.round(), s);
    }
    return;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(delta->layout.total_bytes()));
  metrics_.rounds_completed.Increment();
  const double seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  metrics_.round_duration.Observe(seconds);
  LogInfo(absl::StrFormat("task %s round %d: trained %d batches, loss %.4f, %d samples, %.2f s%s",
                          task, m.round(), stats->batches, stats->mean_loss, stats->samples,
                          seconds, *pushed ? " (duplicate)" : ""));

  PeerMessage out;
  auto* up = out.mutable_update_pushed();
  out.set_task(task);
  up->set_round(m.round());
  up->set_num_samples(stats->samples);
  up->set_train_loss(stats->mean_loss);
  Send(out);
}

void PeerAgent::HandleModelPublished(const std::string& task,
                                     const coordinator::v1::ModelPublished& m) {
  if (!task_ || task_->assigned.spec().name() != task) {
    LogWarning("ModelPublished for task ", task, " which this peer does not have; ignored");
    return;
  }
  absl::Status s = LoadGlobal(m.version(), clock_.Now() + options_.model_transfer_budget,
                              [this] { return TaskStillCurrent(); });
  if (!s.ok()) {
    LogWarning("task ", task, ": cannot get published model version ", m.version(), ": ",
               s.message());
    return;
  }
  PublishSnapshot(m.version());
  absl::StatusOr<training::EvalStats> eval = task_->trainer->Evaluate();
  if (!eval.ok()) {
    LogError("task ", task, ": evaluating version ", m.version(), ": ", eval.status().message());
    SendPeerError(task, m.round(), eval.status());
    return;
  }
  metrics_.test_accuracy.Set(eval->accuracy());
  LogInfo(absl::StrFormat("task %s round %d: model version %d test accuracy %.4f (%d/%d)", task,
                          m.round(), m.version(), eval->accuracy(), eval->correct, eval->total));
  PeerMessage out;
  auto* r = out.mutable_eval_report();
  out.set_task(task);
  r->set_version(m.version());
  r->set_correct(eval->correct);
  r->set_total(eval->total);
  r->set_loss_sum(eval->loss_sum);
  Send(out);
}

void PeerAgent::HandleTaskFinished(const std::string& task,
                                   const coordinator::v1::TaskFinished& m) {
  LogInfo("task ", task, ": finished (", m.state(), ", final model version ", m.final_version(),
          ")");
  if (task_ && task_->assigned.spec().name() == task) {
    EndRunner();
    task_.reset();
  }
}

}  // namespace shoal::peer
