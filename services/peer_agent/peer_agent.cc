#include "services/peer_agent/peer_agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/common/heap.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/data/feature_moments.h"
#include "libs/data/task_data.h"
#include "libs/task/task_privacy.h"
#include "services/peer_agent/mode_registry.h"
#include "services/peer_agent/reports.h"
#include "services/peer_agent/secure_moments.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;

bool EndsTask(const CoordinatorEvent& e) { return e.has_task_finished() || e.has_task_assigned(); }

// The task an event is about ("" for Welcome).
const std::string& EventTask(const CoordinatorEvent& e) {
  return e.has_task_assigned() ? e.task_assigned().spec().name() : e.task();
}

}  // namespace

absl::Status PeerAgentOptions::Validate() const {
  if (absl::Status s = training::ValidateShardSpec(shard); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard: ", s.message()));
  }
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("device must be cpu or cuda, got ", device));
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
  // Fashion-MNIST may be absent (null) when the peer holds only other data.
  if ((train == nullptr) != (test == nullptr) ||
      (train != nullptr && (train->count == 0 || test->count == 0))) {
    return absl::InvalidArgumentError(
        "the peer agent needs non-empty Fashion-MNIST training and test sets, or neither");
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
      fatal_(std::move(fatal)),
      wakeup_(clock) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

PeerAgent::~PeerAgent() { Stop(); }

void PeerAgent::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wakeup_.Notify();
  if (worker_.joinable()) worker_.join();
}

std::string PeerAgent::peer_id() const {
  absl::MutexLock lock(&mu_);
  return peer_id_;
}

std::string PeerAgent::SessionToken() const {
  absl::MutexLock lock(&mu_);
  return session_token_;
}

void PeerAgent::OnEvent(const CoordinatorEvent& event) {
  if (event.has_welcome()) {
    absl::MutexLock lock(&mu_);
    peer_id_ = event.welcome().peer_id();
    session_token_ = event.welcome().session_token();
    return;
  }
  if (event.has_statistics() || event.has_secure_statistics()) {
    // Taken here, not queued: the worker waits for them in the middle of setting up the task.
    {
      absl::MutexLock lock(&mu_);
      if (event.has_statistics()) {
        statistics_task_ = event.task();
        statistics_ = event.statistics();
      } else {
        statistics_steps_.push_back(event);
      }
    }
    wakeup_.Notify();
    return;
  }
  const bool ends_task = EndsTask(event);
  // Without a runner of the event's task (it is being set up) nobody can tell what the event
  // means for the work in progress: assume it supersedes it.
  bool superseding = true;
  {
    // Events of the runner's task go through it first (it may consume them, and it decides
    // what stops its current work). Only this (reader) thread enqueues, so event order holds.
    absl::MutexLock runner_lock(&runner_mu_);
    if (runner_ != nullptr) {
      if (EventTask(event) == runner_task_) {
        if (!ends_task && runner_->Intercept(event)) return;
        superseding = ends_task || runner_->Supersedes(event);
      } else {
        superseding = ends_task;  // another task's event does not stop this task's work
      }
    }
  }
  {
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
  wakeup_.Notify();
}

void PeerAgent::OnDisconnected() {
  {
    absl::MutexLock lock(&mu_);
    ++queued_superseding_;
    ++queued_task_ending_;
    queue_.push_back(Event{true, {}, true, true});
  }
  wakeup_.Notify();
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
    // An event is a round's step (a download, training and a push): what it freed goes back to
    // the system, not kept in the heap for a next step that may be far off.
    ReturnFreeMemory();
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

void PeerAgent::Handle(const Event& e) {
  if (e.disconnected) {
    // Keep the task, its trainer and its runner: the coordinator usually re-assigns the same
    // task after the reconnect, and then nothing needs reloading. The current round (if any)
    // was abandoned.
    return;
  }
  const CoordinatorEvent& ev = e.event;
  if (ev.has_task_assigned()) {
    HandleTaskAssigned(ev);
    return;
  }
  if (ev.has_task_finished()) {
    HandleTaskFinished(ev);
    return;
  }
  std::shared_ptr<ModeRunner> r = runner();
  if (r == nullptr || !task_ || EventTask(ev) != task_->assigned.spec().name()) {
    LogWarning("ignoring an event (field ", static_cast<int>(ev.kind_case()), ") for task ",
               EventTask(ev), " which this peer does not run");
    return;
  }
  r->Handle(ev, [this] { return NotSuperseded(); });
}

void PeerAgent::Send(const PeerMessage& message) {
  absl::Status s = send_(message);
  if (!s.ok()) {
    // The session is down; the coordinator treats the missing message like a straggler.
    LogWarning("could not send to the coordinator: ", s.message());
  }
}

void PeerAgent::ReportTaskError(const std::string& task, const absl::Status& error) {
  LogError(error.message());
  PeerMessage m = MakePeerError(0, error);
  m.set_task(task);
  Send(m);
}

void PeerAgent::SendDataReport() {
  const training::Trainer& trainer = *task_->trainer;
  PeerMessage m;
  m.set_task(task_->assigned.spec().name());
  coordinator::v1::DataReport& report = *m.mutable_data_report();
  report.set_train_samples(trainer.train_size());
  report.set_test_samples(trainer.test_size());
  for (uint64_t count : trainer.label_histogram()) report.add_label_histogram(count);
  Send(m);
}

absl::StatusOr<common::v1::FederationStatistics> PeerAgent::AwaitStatistics(
    const common::v1::TaskSpec& spec, const data::Dataset& train,
    const std::vector<int64_t>& rows) {
  const std::string& task = spec.name();
  SHOAL_ASSIGN_OR_RETURN(const data::FeatureMoments moments, data::ComputeMoments(train, rows));
  PeerMessage m;
  m.set_task(task);
  std::optional<SecureMoments> secure;
  if (task::HasSecureAggregation(spec)) {
    // Masked: the coordinator learns only the sum of the participants' moments.
    SHOAL_ASSIGN_OR_RETURN(
        secure, SecureMoments::Create(task, peer_id(), moments, task::StatisticsFeatureBound(spec),
                                      options_.identity, train.feature_names));
    SHOAL_ASSIGN_OR_RETURN(*m.mutable_data_moments()->mutable_secure(), secure->Advertise(0));
  } else {
    coordinator::v1::DataMoments& out = *m.mutable_data_moments();
    out.set_count(moments.count);
    for (double v : moments.sum) out.add_sum(v);
    for (double v : moments.sum_squares) out.add_sum_squares(v);
  }
  LogInfo("task ", task, ": sent the ", secure ? "mask key for the masked " : "", "moments of ",
          moments.count, " training samples; waiting for the federation's statistics");
  {
    absl::MutexLock lock(&mu_);
    statistics_steps_.clear();  // an earlier task's
  }
  Send(m);
  const absl::Time deadline = clock_.Now() + options_.statistics_timeout;
  std::optional<common::v1::FederationStatistics> got;
  std::deque<CoordinatorEvent> steps;
  while (!got.has_value()) {
    wakeup_.SleepFor(deadline - clock_.Now(), [&] {
      absl::MutexLock lock(&mu_);
      if (statistics_.has_value() && statistics_task_ == task) got = *statistics_;
      steps.swap(statistics_steps_);
      return !got.has_value() && steps.empty() && !stopping_ && queued_task_ending_ == 0;
    });
    if (got.has_value() || steps.empty()) break;
    for (; !steps.empty(); steps.pop_front()) {
      if (!secure || steps.front().task() != task) continue;
      absl::StatusOr<std::optional<coordinator::v1::SecureMoments>> answer =
          secure->Answer(steps.front().secure_statistics());
      if (!answer.ok()) {
        return absl::Status(answer.status().code(),
                            absl::StrCat("secure statistics: ", answer.status().message()));
      }
      if (!answer->has_value()) continue;
      PeerMessage reply;
      reply.set_task(task);
      *reply.mutable_data_moments()->mutable_secure() = **std::move(answer);
      Send(reply);
    }
  }
  if (got.has_value()) return *std::move(got);
  if (!TaskStillCurrent()) {
    return absl::CancelledError("the task changed while waiting for the federation's statistics");
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no federation statistics within ", absl::FormatDuration(options_.statistics_timeout),
      " (normalization standardize: the coordinator fixes them once min_participants peers have "
      "sent their moments; give dataset.mean and dataset.std, or normalization "
      "standardize-local)"));
}

absl::StatusOr<std::unique_ptr<training::Trainer>> PeerAgent::MakeTrainer(
    const coordinator::v1::TaskAssigned& assigned, const training::TrainerOptions& options) {
  const std::string& task = assigned.spec().name();
  if (data::UsesOwnFiles(options.spec.dataset())) {
    SHOAL_ASSIGN_OR_RETURN(data::TaskData own,
                           data::LoadTaskData(options.spec.dataset(), options_.data_dir,
                                              training::PartitionSeed(options.spec)));
    LogInfo("task ", task, ": data: ", own.summary);
    if (own.awaits_statistics) {
      common::v1::FederationStatistics stats = assigned.statistics();
      if (!assigned.has_statistics()) {
        SHOAL_ASSIGN_OR_RETURN(
            const std::vector<int64_t> rows,
            training::TrainShardIndices(options.spec, options.shard, own.train.labels,
                                        static_cast<int>(own.train.class_names.size())));
        SHOAL_ASSIGN_OR_RETURN(stats, AwaitStatistics(options.spec, own.train, rows));
      }
      data::FeatureStatistics fs;
      fs.mean.assign(stats.mean().begin(), stats.mean().end());
      fs.stddev.assign(stats.std().begin(), stats.std().end());
      if (absl::Status s = data::StandardizeTaskData(fs, own); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("normalization standardize: ", s.message()));
      }
      LogInfo("task ", task, ": standardised with the federation's statistics (", stats.samples(),
              " training samples of ", stats.peers_size(), " peers)");
    }
    return training::Trainer::Create(options, own.train, own.test);
  }
  if (train_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the task trains on fashion-mnist, but --data-dir ", options_.data_dir,
                     " does not hold its files (",
                     training::CheckFashionMnistDir(options_.data_dir).message(), ")"));
  }
  return training::Trainer::Create(options, *train_, *test_);
}

void PeerAgent::HandleTaskAssigned(const CoordinatorEvent& ev) {
  const coordinator::v1::TaskAssigned& m = ev.task_assigned();
  const std::string& name = m.spec().name();
  if (task_ && task_->assigned.spec().SerializeAsString() == m.spec().SerializeAsString()) {
    // The same task again (a reconnect, a coordinator restart, another aggregator): the runner
    // carries on with what it holds and takes what changed from the event.
    task_->assigned = m;
    SendDataReport();  // the coordinator forgot it if this peer left the task meanwhile
    if (std::shared_ptr<ModeRunner> r = runner(); r != nullptr) {
      r->Handle(ev, [this] { return NotSuperseded(); });
      return;
    }
    LogInfo("task ", name, ": assigned again; it has no runner (it failed to start), retrying");
    StartRunner();
    return;
  }
  EndRunner();
  task_.reset();
  snapshots_.Clear();
  {
    absl::MutexLock lock(&mu_);
    if (statistics_task_ != name) statistics_.reset();  // another task's
  }
  if (absl::Status s = training::CheckModelName(m.spec().model(), /*torchscript_ok=*/true);
      !s.ok()) {
    absl::Status error = absl::InvalidArgumentError(
        absl::StrCat("task ", name, " cannot run on this peer: ", s.message()));
    ReportTaskError(name, error);
    if (fatal_) fatal_(error);
    return;
  }
  training::TrainerOptions trainer_options;
  trainer_options.spec = m.spec();
  trainer_options.shard = options_.shard;
  trainer_options.device = options_.device;
  trainer_options.model_dir = options_.model_dir;
  trainer_options.after_batch = BindAfterBatch(options_.hooks.after_batch, wakeup_);
  const absl::Time start = clock_.Now();
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer = MakeTrainer(m, trainer_options);
  if (absl::IsCancelled(trainer.status())) {
    // A newer event (another assignment, the end of the task, a lost session) takes over.
    LogInfo("task ", name, ": setup abandoned: ", trainer.status().message());
    return;
  }
  if (!trainer.ok()) {
    ReportTaskError(name, absl::Status(trainer.status().code(),
                                       absl::StrCat("task ", name, ": cannot set up training: ",
                                                    trainer.status().message())));
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
  LogInfo("task ", name, ": training samples per class ",
          absl::StrJoin(state.trainer->label_histogram(), " "));
  if (const std::string dp = state.trainer->PrivacyDescription(); !dp.empty()) {
    LogInfo("task ", name, ": differential privacy: every step is ", dp);
  }
  task_ = std::move(state);
  SendDataReport();
  StartRunner();
}

void PeerAgent::StartRunner() {
  const std::string name = task_->assigned.spec().name();
  ModeRunnerDeps deps;
  deps.assigned = task_->assigned;
  deps.trainer = task_->trainer.get();
  deps.snapshots = &snapshots_;
  deps.peers = &peers_;
  deps.aggregator = &aggregator_;
  deps.metrics = &metrics_;
  deps.clock = &clock_;
  deps.wakeup = &wakeup_;
  deps.peer_id = peer_id();
  deps.scratch_dir = options_.scratch_dir;
  deps.measured_upload = options_.measured_upload;
  deps.state_dir = options_.state_dir;
  deps.evaluate_beside_training = options_.evaluate_beside_training;
  deps.download_against_held = options_.download_against_held;
  deps.session_token = [this] { return SessionToken(); };
  deps.task_current = [this] { return TaskStillCurrent(); };
  deps.update_hooks = options_.hooks.update;
  deps.identity = options_.identity;
  deps.identity_public_key = options_.identity_public_key;
  deps.send = [this, name](const PeerMessage& m) {
    PeerMessage stamped = m;
    stamped.set_task(name);
    Send(stamped);
  };
  absl::StatusOr<std::unique_ptr<ModeRunner>> made = CreateModeRunner(std::move(deps));
  if (!made.ok()) {
    ReportTaskError(name, absl::Status(made.status().code(),
                                       absl::StrCat("task ", name, ": ", made.status().message())));
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

void PeerAgent::HandleTaskFinished(const CoordinatorEvent& ev) {
  const coordinator::v1::TaskFinished& m = ev.task_finished();
  LogInfo("task ", ev.task(), ": finished (", m.state(), ", final model version ",
          m.final_version(), ")");
  if (task_ && task_->assigned.spec().name() == ev.task()) {
    if (std::shared_ptr<ModeRunner> r = runner(); r != nullptr) r->Finished();
    EndRunner();
    task_.reset();
  }
}

}  // namespace shoal::peer
