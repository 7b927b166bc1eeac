#include "services/coordinator/coordinator_core.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/task/task_file.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/model_file.h"

namespace shoal::coordinator {
namespace {

using v1::RoundPhase;
using v1::TaskState;

const char* StateName(TaskState state) {
  switch (state) {
    case v1::TASK_STATE_WAITING:
      return "waiting";
    case v1::TASK_STATE_RUNNING:
      return "running";
    case v1::TASK_STATE_COMPLETED:
      return "completed";
    case v1::TASK_STATE_STOPPED:
      return "stopped";
    case v1::TASK_STATE_FAILED:
      return "failed";
    default:
      return "unspecified";
  }
}

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }

// "federated-sync" for MODE_FEDERATED_SYNC: a bounded metric label.
std::string ModeName(common::v1::Mode mode) {
  std::string name = absl::AsciiStrToLower(common::v1::Mode_Name(mode).substr(5));
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// 128 random bits from OpenSSL's CSPRNG, hex-encoded.
std::string NewSessionToken() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    LogError("RAND_bytes failed; cannot issue session tokens");
    std::abort();  // an invariant: without randomness no token is safe to hand out
  }
  std::string hex;
  for (unsigned char b : bytes) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

// Whether a peer that presented `token` may join `spec`'s task.
bool TokenAdmits(const common::v1::TaskSpec& spec, const std::string& token) {
  return spec.join_token().empty() || spec.join_token() == token;
}

std::string HexDigest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorCore>> CoordinatorCore::Create(
    CoordinatorOptions options, TaskStore& store, aggregator::AggregatorClient& aggregators,
    Clock& clock, CoordinatorMetrics& metrics) {
  std::unique_ptr<CoordinatorCore> core(
      new CoordinatorCore(options, store, aggregators, clock, metrics));
  SHOAL_ASSIGN_OR_RETURN(std::vector<StoredTask> stored, store.LoadTasks());
  absl::MutexLock lock(&core->mu_);
  std::sort(stored.begin(), stored.end(), [](const StoredTask& a, const StoredTask& b) {
    return a.status.created_unix_ms() < b.status.created_unix_ms();
  });
  for (StoredTask& s : stored) {
    const std::string name = s.status.spec().name();
    Task& task = core->tasks_[name];
    task.status = std::move(s.status);
    for (auto& round : s.history) *task.status.add_history() = std::move(round);
    core->task_order_.push_back(name);
    if (!core->IsActive(task)) continue;
    if (task.status.spec().mode() != common::v1::MODE_FEDERATED_SYNC) {
      // No aggregator and no checkpoints: a fresh state machine from the stored status; peers
      // tell it again what they hold when they are re-assigned.
      task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
      task.status.set_state(v1::TASK_STATE_WAITING);
      task.status.clear_aggregator();
      task.status.clear_peers();
      task.mode = MakeModeTask(task.status, core->metrics_);
      if (task.mode == nullptr) {
        task.status.set_state(v1::TASK_STATE_FAILED);
        task.status.set_message(absl::StrCat("mode ", ModeName(task.status.spec().mode()),
                                             " is not supported by this coordinator"));
        LogWarning("task ", name, ": ", task.status.message());
        continue;
      }
      task.status.set_message("resuming after a coordinator restart");
      LogInfo("task ", name, ": resuming after round ", task.status.model_version());
      continue;
    }
    // Resume: the aggregator that held the model may be gone, so restart from the newest
    // checkpoint (or from scratch when there is none) on whichever aggregator is available.
    task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    task.status.set_state(v1::TASK_STATE_WAITING);
    task.status.clear_aggregator();
    absl::StatusOr<StoredCheckpoint> checkpoint = store.GetCheckpoint(name, std::nullopt);
    uint64_t resume_round = 0;
    if (checkpoint.ok()) {
      task.restore_from = *checkpoint;
      resume_round = checkpoint->round;
      task.status.set_model_version(checkpoint->version);
    } else {
      task.status.set_model_version(0);
    }
    task.status.set_round(resume_round);
    auto* history = task.status.mutable_history();
    while (!history->empty() && history->rbegin()->round() > resume_round) history->RemoveLast();
    task.status.set_message(
        absl::StrCat("resuming after a coordinator restart from round ", resume_round));
    LogInfo("task ", name, ": resuming from round ", resume_round);
  }
  return core;
}

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, TaskStore& store,
                                 aggregator::AggregatorClient& aggregators, Clock& clock,
                                 CoordinatorMetrics& metrics)
    : options_(options),
      store_(store),
      aggregators_(aggregators),
      clock_(clock),
      metrics_(metrics) {}

CoordinatorCore::InputLock::InputLock(CoordinatorCore& core, Outbox& out) : core_(core), out_(out) {
  core_.mu_.Lock();
}

CoordinatorCore::InputLock::~InputLock() {
  for (auto& fn : out_) core_.effects_.push_back(std::move(fn));
  out_.clear();
  core_.mu_.Unlock();
}

void CoordinatorCore::Flush() {
  {
    absl::MutexLock lock(&mu_);
    if (flushing_) return;  // the thread flushing now runs ours too (or we are inside it)
    flushing_ = true;
  }
  for (;;) {
    std::function<void()> effect;
    {
      absl::MutexLock lock(&mu_);
      if (effects_.empty()) {
        flushing_ = false;
        return;
      }
      effect = std::move(effects_.front());
      effects_.pop_front();
    }
    effect();
  }
}

bool CoordinatorCore::IsActive(const Task& task) const {
  return task.status.state() == v1::TASK_STATE_WAITING ||
         task.status.state() == v1::TASK_STATE_RUNNING;
}

void CoordinatorCore::ExpectEvaluation(Task& task, const std::string& peer_id, uint64_t version) {
  if (peers_.count(peer_id)) task.evaluating[version].insert(peer_id);
}

void CoordinatorCore::EvaluationDone(Task& task, const std::string& peer_id, Outbox& out,
                                     std::optional<uint64_t> version) {
  std::vector<uint64_t> complete;
  for (auto& [v, pending] : task.evaluating) {
    if (version.has_value() && v != *version) continue;
    if (pending.erase(peer_id) && pending.empty()) complete.push_back(v);
  }
  for (uint64_t v : complete) CompleteEvaluation(task, v, out);
}

void CoordinatorCore::CompleteEvaluation(Task& task, uint64_t version, Outbox& out) {
  task.evaluating.erase(version);
  auto* history = task.status.mutable_history();
  for (int i = history->size() - 1; i >= 0; --i) {
    v1::RoundSummary& r = (*history)[i];
    if (r.model_version() != version) continue;
    if (r.evaluation_complete()) return;
    r.set_evaluation_complete(true);
    task.unsaved_rounds.erase(r.round());
    out.push_back([this, name = task.status.spec().name(), r] {
      absl::Status s = store_.PutRound(name, r);
      if (!s.ok()) LogError("task ", name, ": cannot persist round: ", s.message());
    });
    return;  // the caller marks the task changed
  }
}

void CoordinatorCore::SendTo(const std::string& peer_id, v1::CoordinatorEvent event, Outbox& out) {
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return;
  out.push_back([sink = it->second.sink, event = std::move(event)] { sink->Send(event); });
}

v1::TaskStatus CoordinatorCore::StatusOf(const Task& task) const {
  v1::TaskStatus status = task.status;
  status.mutable_spec()->clear_join_token();  // a secret: never leaves the coordinator
  for (const std::string& id : task.peers) status.add_participants(id);
  return status;
}

void CoordinatorCore::NotifyWatchers(const Task& task, Outbox& out) {
  // Built only when someone watches, and shared by all of them: a status carries the whole
  // history, which with many peers is large.
  std::shared_ptr<const v1::TaskStatus> status;
  for (const auto& [handle, watcher] : watchers_) {
    if (watcher.first != task.status.spec().name()) continue;
    if (status == nullptr) status = std::make_shared<const v1::TaskStatus>(StatusOf(task));
    out.push_back([cb = watcher.second, status] { cb(*status); });
  }
}

void CoordinatorCore::MarkChanged(Task& task, Outbox& out) {
  NotifyWatchers(task, out);
  // The store keeps the whole spec, join token included (StatusOf strips it), but not the
  // history (rounds are stored one by one): copy the status without it, which would make every
  // change cost O(rounds x peers).
  google::protobuf::RepeatedPtrField<v1::RoundSummary> history;
  history.Swap(task.status.mutable_history());
  v1::TaskStatus stored = task.status;
  history.Swap(task.status.mutable_history());
  out.push_back([this, stored = std::move(stored)] {
    absl::Status s = store_.PutTask(stored);
    if (!s.ok()) LogError("task ", stored.spec().name(), ": cannot persist: ", s.message());
  });
}

void CoordinatorCore::SaveRounds(Task& task, Outbox& out) {
  if (task.unsaved_rounds.empty()) return;
  for (const v1::RoundSummary& r : task.status.history()) {
    if (task.unsaved_rounds.count(r.round()) == 0) continue;
    out.push_back([this, name = task.status.spec().name(), r] {
      absl::Status s = store_.PutRound(name, r);
      if (!s.ok()) LogError("task ", name, ": cannot persist round: ", s.message());
    });
  }
  task.unsaved_rounds.clear();
}

// --- Peers -------------------------------------------------------------------------------

absl::StatusOr<std::string> CoordinatorCore::Connect(const v1::Hello& hello,
                                                     const std::string& identity,
                                                     std::shared_ptr<PeerSink> sink) {
  if (!identity.empty() && !hello.name().empty() && hello.name() != identity) {
    return absl::PermissionDeniedError(absl::StrCat(
        "hello: name \"", hello.name(), "\" is not the certificate's (\"", identity, "\")"));
  }
  if (hello.shard_count() == 0 || hello.shard_index() >= hello.shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat("hello: shard ", hello.shard_index(), "/",
                                                   hello.shard_count(), " is not valid"));
  }
  if (hello.name().size() > 128) {
    return absl::InvalidArgumentError("hello: name longer than 128 characters");
  }
  Outbox out;
  std::string id;
  {
    InputLock lock(*this, out);
    bool any_open = false;
    bool admitted = false;
    for (const auto& [name, t] : tasks_) {
      if (!IsActive(t)) continue;
      any_open = true;
      admitted = admitted || TokenAdmits(t.status.spec(), hello.join_token());
    }
    if (any_open && !admitted) {
      return absl::UnauthenticatedError(hello.join_token().empty()
                                            ? "hello: every open task needs a join token"
                                            : "hello: the join token matches no open task");
    }
    id = !hello.name().empty() ? hello.name()
         : !identity.empty()   ? identity
                               : absl::StrCat("peer-", next_peer_++);
    auto it = peers_.find(id);
    std::string task;
    if (it != peers_.end()) {
      // A reconnect (or a clash of names): the newer stream wins and keeps the assignment.
      LogWarning("peer ", id, ": new session replaces the previous one");
      out.push_back([old = it->second.sink] {
        old->Close(absl::AbortedError("replaced by a newer session with the same name"));
      });
      task = it->second.task;
    }
    Peer& peer = peers_[id];
    peer.id = id;
    peer.hello = hello;
    peer.sink = sink;
    peer.last_seen = clock_.Now();
    peer.task = task;
    peer.session_token = NewSessionToken();
    metrics_.peers_connected.Set(static_cast<double>(peers_.size()));
    v1::CoordinatorEvent welcome;
    welcome.mutable_welcome()->set_peer_id(id);
    welcome.mutable_welcome()->set_session_token(peer.session_token);
    welcome.mutable_welcome()->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
    SendTo(id, std::move(welcome), out);
    if (!task.empty()) {
      // It keeps its task (with a new session token): tell it again so it reloads its state.
      Task& t = tasks_[task];
      t.members_dirty = true;
      v1::CoordinatorEvent assigned;
      assigned.set_task(task);
      *assigned.mutable_task_assigned()->mutable_spec() = t.status.spec();
      assigned.mutable_task_assigned()->mutable_spec()->clear_join_token();
      assigned.mutable_task_assigned()->set_aggregator_address(t.status.aggregator());
      SendTo(id, std::move(assigned), out);
      if (t.mode != nullptr && IsActive(t)) {
        // Its mode state starts over: it announces its model again (e.g. ModelHeld).
        ModeEffects fx;
        const absl::Time now = clock_.Now();
        t.mode->RemovePeer(id, "reconnected", now, t.status, fx);
        t.mode->AddPeer(ModePeer{id, hello.listen_address()}, now, t.status, fx);
        ApplyModeEffects(t, fx, out);
      }
    }
    LogInfo("peer ", id, " connected (shard ", hello.shard_index(), "/", hello.shard_count(), ", ",
            hello.device().empty() ? "cpu" : hello.device(), ")");
    Reconcile(out);
  }
  Flush();
  return id;
}

void CoordinatorCore::Disconnect(const std::string& peer_id, const PeerSink* sink) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = peers_.find(peer_id);
    if (it == peers_.end() || it->second.sink.get() != sink) return;
    metrics_.peers_crashed.Increment();
    RemovePeer(peer_id, "stream closed without Leave", out);
    Reconcile(out);
  }
  Flush();
}

void CoordinatorCore::RemovePeer(const std::string& peer_id, const std::string& why, Outbox& out) {
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return;
  const std::string task_name = it->second.task;
  peers_.erase(it);
  metrics_.peers_connected.Set(static_cast<double>(peers_.size()));
  LogInfo("peer ", peer_id, " left: ", why);
  if (task_name.empty()) return;
  Task& task = tasks_[task_name];
  task.peers.erase(peer_id);
  task.members_dirty = true;
  task.round.expected.erase(peer_id);
  EvaluationDone(task, peer_id, out);
  ModeRemovePeer(task, peer_id, why, out);
  MarkChanged(task, out);
}

void CoordinatorCore::ModeRemovePeer(Task& task, const std::string& peer_id, const std::string& why,
                                     Outbox& out) {
  if (task.mode == nullptr || !IsActive(task)) return;
  ModeEffects fx;
  task.mode->RemovePeer(peer_id, why, clock_.Now(), task.status, fx);
  ApplyModeEffects(task, fx, out);
}

void CoordinatorCore::ApplyModeEffects(Task& task, ModeEffects& fx, Outbox& out) {
  for (auto& [id, event] : fx.events) {
    event.set_task(task.status.spec().name());
    if (event.has_model_published()) {
      ExpectEvaluation(task, id, event.model_published().version());
    }
    SendTo(id, std::move(event), out);
  }
  const std::string& name = task.status.spec().name();
  for (const v1::RoundSummary& summary : fx.rounds_completed) {
    *task.status.add_history() = summary;
    metrics_.rounds_completed.Increment();
    metrics_.round_duration.Observe(static_cast<double>(summary.duration_ms()) / 1000.0);
    if (summary.participants_size() > 0) metrics_.train_loss.Set(summary.mean_train_loss());
    out.push_back([this, name, summary] {
      absl::Status s = store_.PutRound(name, summary);
      if (!s.ok()) LogError("task ", name, ": cannot persist round: ", s.message());
    });
  }
  if (fx.finish.has_value()) {
    Finish(task, fx.finish->first, fx.finish->second, out);  // marks the task changed
    return;
  }
  if (fx.changed || !fx.rounds_completed.empty()) MarkChanged(task, out);
}

absl::Status CoordinatorCore::OnMessage(const std::string& peer_id,
                                        const v1::PeerMessage& message) {
  if (message.kind_case() == v1::PeerMessage::kHeartbeat) {
    // The most frequent message (every peer, every interval) only proves the peer alive: no
    // reconciling of every task and peer for it. Timers run in Step().
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer_id);
    if (it == peers_.end()) return absl::FailedPreconditionError("peer is not connected");
    it->second.last_seen = clock_.Now();
    return absl::OkStatus();
  }
  Outbox out;
  absl::Status result;
  {
    InputLock lock(*this, out);
    auto it = peers_.find(peer_id);
    if (it == peers_.end()) return absl::FailedPreconditionError("peer is not connected");
    Peer& peer = it->second;
    peer.last_seen = clock_.Now();
    auto reject = [&](const char* reason, std::string text) {
      metrics_.messages_rejected.Add({{"reason", reason}}).Increment();
      result = absl::FailedPreconditionError(std::move(text));
    };
    Task* task = nullptr;
    auto find_task = [&](const std::string& name) -> bool {
      if (name != peer.task || tasks_.count(name) == 0) {
        reject("wrong_task", absl::StrCat("peer ", peer_id, " is not in task \"", name, "\""));
        return false;
      }
      task = &tasks_[name];
      return true;
    };
    switch (message.kind_case()) {
      case v1::PeerMessage::kHeartbeat:
        break;
      case v1::PeerMessage::kHello:
        reject("bad_message", "hello sent twice");
        break;
      case v1::PeerMessage::kLeave:
        RemovePeer(peer_id, absl::StrCat("leave: ", message.leave().reason()), out);
        break;
      case v1::PeerMessage::kModelInitialized: {
        if (!find_task(message.task())) break;
        if (task->initializer != peer_id || task->status.phase() != v1::ROUND_PHASE_INITIALIZING ||
            task->has_model) {
          reject("stale", "unexpected model_initialized");
          break;
        }
        task->has_model = true;
        task->status.set_model_version(0);
        task->status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
        task->initializer.clear();
        LogInfo("task ", task->status.spec().name(), ": initial model stored by ", peer_id);
        MarkChanged(*task, out);
        break;
      }
      case v1::PeerMessage::kUpdatePushed: {
        const v1::UpdatePushed& pushed = message.update_pushed();
        if (!find_task(message.task())) break;
        if (task->status.phase() != v1::ROUND_PHASE_TRAINING ||
            pushed.round() != task->round.number || !task->round.expected.count(peer_id)) {
          reject("stale", absl::StrCat("update for round ", pushed.round(), " is not expected"));
          break;
        }
        task->round.pushed.insert(peer_id);
        metrics_.updates_accepted.Increment();
        break;
      }
      case v1::PeerMessage::kEvalReport: {
        const v1::EvalReport& report = message.eval_report();
        if (!find_task(message.task())) break;
        if (report.total() == 0 || report.correct() > report.total()) {
          reject("bad_message", "eval report with total 0 or correct > total");
          break;
        }
        // Credit the newest round that produced this version.
        auto* history = task->status.mutable_history();
        for (int i = history->size() - 1; i >= 0; --i) {
          v1::RoundSummary& r = (*history)[i];
          if (r.model_version() != report.version()) continue;
          const uint64_t samples = r.test_samples() + report.total();
          const double correct = r.test_accuracy() * r.test_samples() + report.correct();
          const double loss = r.test_loss() * r.test_samples() + report.loss_sum();
          r.set_test_samples(samples);
          r.set_test_accuracy(correct / samples);
          r.set_test_loss(loss / samples);
          r.set_evaluated(true);
          metrics_.test_accuracy.Set(r.test_accuracy());
          task->unsaved_rounds.insert(r.round());  // stored by the next Step()
          break;
        }
        EvaluationDone(*task, peer_id, out, report.version());
        // Only the history changed (the task's own record did not), unless a mode task
        // changes more below.
        if (task->mode == nullptr) {
          NotifyWatchers(*task, out);
        } else {
          MarkChanged(*task, out);
        }
        if (task->mode != nullptr && IsActive(*task)) {
          ModeEffects fx;
          absl::Status s = task->mode->OnMessage(peer_id, message, clock_.Now(), task->status, fx);
          ApplyModeEffects(*task, fx, out);
          if (!s.ok()) {
            metrics_.messages_rejected.Add({{"reason", "stale"}}).Increment();
            result = s;
          }
        }
        break;
      }
      case v1::PeerMessage::kError: {
        LogWarning("peer ", peer_id, " reports an error in task ", message.task(), " round ",
                   message.error().round(), ": ", message.error().message());
        if (!find_task(message.task())) break;
        // It cannot take part: release it from the task so the round does not wait for it.
        task->peers.erase(peer_id);
        task->members_dirty = true;
        task->round.expected.erase(peer_id);
        EvaluationDone(*task, peer_id, out);
        peer.task.clear();
        ModeRemovePeer(*task, peer_id, absl::StrCat("error: ", message.error().message()), out);
        MarkChanged(*task, out);
        break;
      }
      case v1::PeerMessage::KIND_NOT_SET:
        reject("bad_message", "empty message");
        break;
      case v1::PeerMessage::kModelHeld:
      case v1::PeerMessage::kJoinRound:
      case v1::PeerMessage::kRoundReady:
      case v1::PeerMessage::kConnectionsReport:
      case v1::PeerMessage::kSharingDone:
      case v1::PeerMessage::kSyncDone:
      case v1::PeerMessage::kGossipProgress: {
        if (!find_task(message.task())) break;
        if (task->mode == nullptr || !IsActive(*task)) {
          reject("wrong_mode", absl::StrCat("task \"", task->status.spec().name(),
                                            "\" does not take this message (mode ",
                                            ModeName(task->status.spec().mode()), ")"));
          break;
        }
        ModeEffects fx;
        absl::Status s = task->mode->OnMessage(peer_id, message, clock_.Now(), task->status, fx);
        ApplyModeEffects(*task, fx, out);
        if (!s.ok()) {
          metrics_.messages_rejected
              .Add({{"reason",
                     s.code() == absl::StatusCode::kInvalidArgument ? "bad_message" : "stale"}})
              .Increment();
          result = s;
        }
        break;
      }
    }
    Reconcile(out);
  }
  Flush();
  return result;
}

// --- Aggregators -------------------------------------------------------------------------

absl::Status CoordinatorCore::RegisterAggregator(const std::string& address) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: expected HOST:PORT, got \"", address, "\""));
  }
  Outbox out;
  {
    InputLock lock(*this, out);
    if (aggregator_seen_.count(address) == 0) LogInfo("aggregator ", address, " registered");
    aggregator_seen_[address] = clock_.Now();
    metrics_.aggregators_registered.Set(static_cast<double>(aggregator_seen_.size()));
    Reconcile(out);
  }
  Flush();
  return absl::OkStatus();
}

std::string CoordinatorCore::PickAggregator() const {
  std::string best;
  size_t best_load = SIZE_MAX;
  for (const auto& [address, seen] : aggregator_seen_) {
    size_t load = 0;
    for (const auto& [name, task] : tasks_) {
      if (IsActive(task) && task.status.aggregator() == address) ++load;
    }
    if (load < best_load) {
      best = address;
      best_load = load;
    }
  }
  return best;
}

// --- Operators ---------------------------------------------------------------------------

absl::StatusOr<v1::TaskStatus> CoordinatorCore::CreateTask(const common::v1::TaskSpec& spec) {
  SHOAL_RETURN_IF_ERROR(task::ValidateTaskSpec(spec));
  Outbox out;
  v1::TaskStatus result;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(spec.name());
    if (it != tasks_.end()) {
      if (it->second.status.spec().SerializeAsString() != spec.SerializeAsString()) {
        return absl::AlreadyExistsError(
            absl::StrCat("a task named \"", spec.name(), "\" exists with a different spec"));
      }
      return StatusOf(it->second);
    }
    v1::TaskStatus status;
    *status.mutable_spec() = spec;
    status.set_state(v1::TASK_STATE_WAITING);
    status.set_created_unix_ms(UnixMillis(clock_.Now()));
    status.set_message("waiting for peers");
    std::unique_ptr<ModeTask> mode;
    if (spec.mode() != common::v1::MODE_FEDERATED_SYNC) {
      mode = MakeModeTask(status, metrics_);
      if (mode == nullptr) {
        return absl::UnimplementedError(absl::StrCat("mode: ", ModeName(spec.mode()),
                                                     " is not supported by this coordinator yet"));
      }
    }
    Task& task = tasks_[spec.name()];
    task_order_.push_back(spec.name());
    task.status = std::move(status);
    task.mode = std::move(mode);
    LogInfo("task ", spec.name(), " created: ", spec.rounds(), " rounds of ", spec.round_batches(),
            " batches, min ", spec.min_participants(), " peers");
    MarkChanged(task, out);
    Reconcile(out);
    result = StatusOf(task);
  }
  Flush();
  return result;
}

std::vector<v1::TaskStatus> CoordinatorCore::ListTasks() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TaskStatus> out;
  for (const std::string& name : task_order_) {
    v1::TaskStatus status = StatusOf(tasks_.at(name));
    status.clear_history();
    out.push_back(std::move(status));
  }
  return out;
}

absl::StatusOr<v1::TaskStatus> CoordinatorCore::GetTaskStatus(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(name);
  if (it == tasks_.end()) return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
  return StatusOf(it->second);
}

absl::StatusOr<v1::TaskStatus> CoordinatorCore::StopTask(const std::string& name) {
  Outbox out;
  v1::TaskStatus result;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) {
      return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
    }
    if (IsActive(it->second))
      Finish(it->second, v1::TASK_STATE_STOPPED, "stopped by operator", out);
    Reconcile(out);
    result = StatusOf(it->second);
  }
  Flush();
  return result;
}

absl::StatusOr<uint64_t> CoordinatorCore::Watch(const std::string& name, StatusCallback callback) {
  v1::TaskStatus status;
  uint64_t handle;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) {
      return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
    }
    handle = next_watch_++;
    watchers_[handle] = {name, callback};
    // Through the effects queue, so that no older status can overtake this one.
    effects_.push_back([callback, status = StatusOf(it->second)] { callback(status); });
  }
  Flush();
  return handle;
}

void CoordinatorCore::Unwatch(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(handle);
}

absl::StatusOr<StoredCheckpoint> CoordinatorCore::GetCheckpoint(
    const std::string& name, std::optional<uint64_t> version) const {
  {
    absl::MutexLock lock(&mu_);
    if (tasks_.count(name) == 0) {
      return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
    }
  }
  return store_.GetCheckpoint(name, version);
}

// --- The state machine --------------------------------------------------------------------

CoordinatorCore::Job CoordinatorCore::MakeJob(JobKind kind, const std::string& task,
                                              const std::string& aggregator, uint64_t round,
                                              uint64_t version) {
  Job job;
  job.kind = kind;
  job.task = task;
  job.aggregator = aggregator;
  job.round = round;
  job.version = version;
  return job;
}

void CoordinatorCore::Enqueue(Task& task, Job job) {
  task.job_in_flight = true;
  jobs_.push_back(std::move(job));
}

void CoordinatorCore::Finish(Task& task, TaskState state, const std::string& message, Outbox& out) {
  const std::string& name = task.status.spec().name();
  task.status.set_state(state);
  task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
  task.status.set_message(message);
  LogInfo("task ", name, " ", StateName(state), ": ", message);
  v1::CoordinatorEvent event;
  event.set_task(name);
  event.mutable_task_finished()->set_state(StateName(state));
  event.mutable_task_finished()->set_final_version(task.status.model_version());
  for (const std::string& id : task.peers) {
    SendTo(id, event, out);
    auto p = peers_.find(id);
    if (p != peers_.end()) p->second.task.clear();
  }
  task.peers.clear();
  task.round = Round{};
  while (!task.evaluating.empty()) CompleteEvaluation(task, task.evaluating.begin()->first, out);
  if (!task.status.aggregator().empty()) {
    jobs_.push_back(MakeJob(JobKind::kRelease, name,
                            task.status.aggregator()));  // fire and forget: does not block the task
  }
  MarkChanged(task, out);
}

void CoordinatorCore::Fail(Task& task, const std::string& step, const absl::Status& status,
                           Outbox& out) {
  metrics_.aggregator_errors.Increment();
  task.failures++;
  const absl::Duration backoff =
      std::min(options_.retry_max, options_.retry_initial * (1 << std::min(task.failures, 10)));
  task.retry_at = clock_.Now() + backoff;
  task.status.set_message(absl::StrCat(step, " failed at aggregator ", task.status.aggregator(),
                                       ": ", status.message(), " (retrying)"));
  LogWarning("task ", task.status.spec().name(), ": ", task.status.message());
  if (task.failures >= options_.max_aggregator_failures) {
    Finish(task, v1::TASK_STATE_FAILED,
           absl::StrCat(step, " failed ", task.failures, " times at aggregator ",
                        task.status.aggregator(), ": ", status.message()),
           out);
    return;
  }
  MarkChanged(task, out);
}

void CoordinatorCore::AssignIdlePeers(Outbox& out) {
  // Runs after every input: when no task can take a peer, skip the walk over every peer.
  const bool any_room = std::any_of(task_order_.begin(), task_order_.end(), [&](const auto& name) {
    const Task& task = tasks_.at(name);
    const uint32_t max = task.status.spec().max_participants();
    return IsActive(task) && (task.mode != nullptr || !task.status.aggregator().empty()) &&
           (max == 0 || task.peers.size() < max);
  });
  if (!any_room) return;
  for (auto& [id, peer] : peers_) {
    if (!peer.task.empty()) continue;
    for (const std::string& name : task_order_) {
      Task& task = tasks_[name];
      if (!IsActive(task) || (task.mode == nullptr && task.status.aggregator().empty())) continue;
      const uint32_t max = task.status.spec().max_participants();
      if (max != 0 && task.peers.size() >= max) continue;
      if (!TokenAdmits(task.status.spec(), peer.hello.join_token())) continue;
      peer.task = name;
      task.peers.insert(id);
      task.members_dirty = true;
      v1::CoordinatorEvent event;
      event.set_task(name);
      *event.mutable_task_assigned()->mutable_spec() = task.status.spec();
      event.mutable_task_assigned()->mutable_spec()->clear_join_token();
      event.mutable_task_assigned()->set_aggregator_address(task.status.aggregator());
      SendTo(id, std::move(event), out);
      LogInfo("peer ", id, " assigned to task ", name);
      MarkChanged(task, out);
      if (task.mode != nullptr) {
        ModeEffects fx;
        task.mode->AddPeer(ModePeer{id, peer.hello.listen_address()}, clock_.Now(), task.status,
                           fx);
        ApplyModeEffects(task, fx, out);
      }
      break;
    }
  }
}

void CoordinatorCore::Reconcile(Outbox& out) {
  const absl::Time now = clock_.Now();
  // Aggregators that stopped registering are forgotten (their tasks fail on their next call).
  for (auto it = aggregator_seen_.begin(); it != aggregator_seen_.end();) {
    if (now - it->second > options_.aggregator_ttl) {
      LogWarning("aggregator ", it->first, " stopped registering");
      it = aggregator_seen_.erase(it);
    } else {
      ++it;
    }
  }
  metrics_.aggregators_registered.Set(static_cast<double>(aggregator_seen_.size()));
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (IsActive(task) && task.mode == nullptr && task.status.aggregator().empty()) {
      task.status.set_aggregator(PickAggregator());
      if (task.status.aggregator().empty()) {
        if (task.status.message() != "waiting for an aggregator to register") {
          task.status.set_message("waiting for an aggregator to register");
          MarkChanged(task, out);
        }
      } else {
        LogInfo("task ", name, " uses aggregator ", task.status.aggregator());
        MarkChanged(task, out);
      }
    }
  }
  AssignIdlePeers(out);
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task)) continue;
    if (task.mode != nullptr) {
      ModeEffects fx;
      task.mode->Tick(now, task.status, fx);
      ApplyModeEffects(task, fx, out);
    } else if (!task.status.aggregator().empty()) {
      Advance(task, out);
    }
  }
  std::map<std::string, double> by_state;
  for (const auto& [name, task] : tasks_) by_state[StateName(task.status.state())] += 1;
  for (const char* state : {"waiting", "running", "completed", "stopped", "failed"}) {
    metrics_.tasks.Add({{"state", state}}).Set(by_state[state]);
  }
  std::map<std::string, double> by_mode;
  for (const auto& [name, task] : tasks_) {
    if (IsActive(task)) by_mode[ModeName(task.status.spec().mode())] += task.peers.size();
  }
  for (int m = common::v1::Mode_MIN; m <= common::v1::Mode_MAX; ++m) {
    if (!common::v1::Mode_IsValid(m) || m == common::v1::MODE_UNSPECIFIED) continue;
    const std::string mode = ModeName(static_cast<common::v1::Mode>(m));
    metrics_.participants.Add({{"mode", mode}}).Set(by_mode[mode]);
  }
}

void CoordinatorCore::Advance(Task& task, Outbox& out) {
  const absl::Time now = clock_.Now();
  const common::v1::TaskSpec& spec = task.status.spec();
  const std::string& name = spec.name();
  if (task.job_in_flight || now < task.retry_at) return;
  if (task.members_dirty) {
    // The aggregator learns who may upload, push and download (and with which session token)
    // before anything else happens for the task.
    task.members_dirty = false;
    Job job = MakeJob(JobKind::kSetMembers, name, task.status.aggregator());
    job.members.set_task(name);
    for (const std::string& id : task.peers) {
      auto peer = peers_.find(id);
      if (peer != peers_.end())
        (*job.members.mutable_session_tokens())[id] = peer->second.session_token;
    }
    Enqueue(task, std::move(job));
    return;
  }

  switch (task.status.phase()) {
    case v1::ROUND_PHASE_INITIALIZING: {
      // A peer is uploading the initial model; give up on it if it left or is too slow.
      const bool gone = !task.initializer.empty() && task.peers.count(task.initializer) == 0;
      if (gone || now >= task.init_deadline) {
        LogWarning("task ", name, ": initializer ", task.initializer, " did not finish");
        task.initializer.clear();
        task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
        break;
      }
      return;
    }
    case v1::ROUND_PHASE_TRAINING: {
      // Every way out of a task (RemovePeer, PeerError, Finish) also takes the peer out of the
      // round, so `expected` holds only live peers. This runs on every message: while pushes
      // are missing, the size test answers without walking the sets.
      const Round& r = task.round;
      const bool all_pushed =
          r.pushed.size() >= r.expected.size() &&
          std::includes(r.pushed.begin(), r.pushed.end(), r.expected.begin(), r.expected.end());
      if (!all_pushed && now < task.round.deadline) return;
      if (!all_pushed) LogWarning("task ", name, ": round ", task.round.number, " deadline passed");
      task.status.set_phase(v1::ROUND_PHASE_CLOSING);
      Enqueue(task,
              MakeJob(JobKind::kCloseRound, name, task.status.aggregator(), task.round.number));
      MarkChanged(task, out);
      return;
    }
    case v1::ROUND_PHASE_EVALUATING: {
      if (task.evaluating.count(task.status.model_version()) && now < task.eval_deadline) return;
      Finish(task, v1::TASK_STATE_COMPLETED, absl::StrCat("completed ", spec.rounds(), " rounds"),
             out);
      return;
    }
    case v1::ROUND_PHASE_OPENING:
    case v1::ROUND_PHASE_CLOSING:
      return;  // a job is in flight (job_in_flight is checked above); nothing to do
    default:
      break;
  }

  // Idle between rounds: get a model, then open the next round when enough peers are here.
  if (!task.has_model) {
    if (task.restore_from.has_value()) {
      task.status.set_phase(v1::ROUND_PHASE_INITIALIZING);
      Job job = MakeJob(JobKind::kRestore, name, task.status.aggregator());
      job.checkpoint = *task.restore_from;
      Enqueue(task, std::move(job));
      MarkChanged(task, out);
      return;
    }
    if (task.peers.empty()) return;
    task.initializer = *task.peers.begin();
    task.init_deadline = now + absl::Seconds(spec.round_deadline_seconds());
    task.status.set_phase(v1::ROUND_PHASE_INITIALIZING);
    task.status.set_message(absl::StrCat("peer ", task.initializer, " stores the initial model"));
    v1::CoordinatorEvent event;
    event.set_task(name);
    event.mutable_initialize_model();
    SendTo(task.initializer, std::move(event), out);
    MarkChanged(task, out);
    return;
  }
  if (task.peers.size() < spec.min_participants()) {
    const std::string notice = absl::StrCat("waiting for peers: have ", task.peers.size(),
                                            ", need ", spec.min_participants());
    if (task.waiting_notice != notice) {
      task.waiting_notice = notice;
      task.status.set_state(v1::TASK_STATE_WAITING);
      task.status.set_message(notice);
      v1::CoordinatorEvent event;
      event.set_task(name);
      event.mutable_waiting()->set_have(static_cast<uint32_t>(task.peers.size()));
      event.mutable_waiting()->set_need(spec.min_participants());
      for (const std::string& id : task.peers) SendTo(id, event, out);
      MarkChanged(task, out);
    }
    return;
  }
  task.waiting_notice.clear();
  Job job = MakeJob(JobKind::kOpenRound, name, task.status.aggregator(), task.status.round() + 1);
  job.open.set_task(name);
  job.open.set_round(job.round);
  job.open.set_base_version(task.status.model_version());
  for (const std::string& id : task.peers) job.open.add_expected_peers(id);
  job.open.set_max_update_norm(spec.max_update_norm());
  task.status.set_phase(v1::ROUND_PHASE_OPENING);
  Enqueue(task, std::move(job));
  MarkChanged(task, out);
}

// --- Driver ------------------------------------------------------------------------------

void CoordinatorCore::WaitForWork(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](std::deque<Job>* jobs) { return !jobs->empty(); }, &jobs_),
                       timeout);
}

void CoordinatorCore::SaveUnsaved() {
  Outbox out;
  {
    InputLock lock(*this, out);
    for (auto& [name, task] : tasks_) SaveRounds(task, out);
  }
  Flush();
}

void CoordinatorCore::Step() {
  Outbox out;
  {
    InputLock lock(*this, out);
    const absl::Time now = clock_.Now();
    std::vector<std::string> silent;
    for (const auto& [id, peer] : peers_) {
      if (now - peer.last_seen > options_.heartbeat_interval * options_.missed_heartbeats) {
        silent.push_back(id);
      }
    }
    for (const std::string& id : silent) {
      out.push_back(
          [sink = peers_[id].sink] { sink->Close(absl::UnavailableError("missed heartbeats")); });
      metrics_.peers_crashed.Increment();
      RemovePeer(id, "missed heartbeats", out);
    }
    for (auto& [name, task] : tasks_) SaveRounds(task, out);
    Reconcile(out);
  }
  Flush();
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      if (jobs_.empty()) break;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    RunJob(job);
  }
}

void CoordinatorCore::RunJob(const Job& job) {
  switch (job.kind) {
    case JobKind::kOpenRound: {
      absl::Status s = aggregators_.OpenRound(job.aggregator, job.open,
                                              clock_.Now() + options_.aggregator_call_timeout);
      FinishJob(job, [&](Task& t, Outbox& out) { OnOpenRoundDone(t, job, s, out); });
      return;
    }
    case JobKind::kCloseRound: {
      aggregator::v1::CloseRoundRequest request;
      request.set_task(job.task);
      request.set_round(job.round);
      auto result = aggregators_.CloseRound(job.aggregator, request,
                                            clock_.Now() + options_.aggregator_call_timeout);
      FinishJob(job, [&](Task& t, Outbox& out) { OnCloseRoundDone(t, job, result, out); });
      return;
    }
    case JobKind::kCheckpoint: {
      absl::StatusOr<tensor::FlatModel> model =
          aggregators_.GetModel(job.aggregator, job.task, job.version, aggregator::Caller{},
                                clock_.Now() + options_.model_transfer_timeout);
      absl::Status s = model.status();
      if (s.ok()) {
        metrics_.bytes_received.Increment(static_cast<double>(model->layout.total_bytes()));
        StoredCheckpoint c;
        c.task = job.task;
        c.version = job.version;
        c.round = job.round;
        c.digest = HexDigest(model->Digest());
        c.path = absl::StrCat(store_.checkpoint_dir(), "/", c.digest, ".model");
        s = tensor::WriteModelFile(c.path, *model);
        if (s.ok()) s = store_.PutCheckpoint(c);
      }
      if (!s.ok()) {
        metrics_.aggregator_errors.Increment();
        LogWarning("task ", job.task, ": checkpoint of version ", job.version,
                   " failed: ", s.message());
      }
      return;
    }
    case JobKind::kRestore: {
      absl::Status s;
      absl::StatusOr<tensor::FlatModel> model = tensor::ReadModelFile(job.checkpoint.path);
      if (!model.ok()) {
        s = model.status();
      } else {
        auto shared = std::make_shared<const tensor::FlatModel>(*std::move(model));
        s = aggregators_
                .PutModel(job.aggregator,
                          tensor::MakeModelMeta(job.task, job.checkpoint.version, *shared), shared,
                          aggregator::Caller{}, clock_.Now() + options_.model_transfer_timeout)
                .status();
        if (s.ok())
          metrics_.bytes_sent.Increment(static_cast<double>(shared->layout.total_bytes()));
      }
      FinishJob(job, [&](Task& t, Outbox& out) { OnRestoreDone(t, job, s, out); });
      return;
    }
    case JobKind::kSetMembers: {
      absl::Status s = aggregators_.SetMembers(job.aggregator, job.members,
                                               clock_.Now() + options_.aggregator_call_timeout);
      FinishJob(job, [&](Task& t, Outbox& out) {
        if (s.ok()) return;
        t.members_dirty = true;
        Fail(t, "set members", s, out);
      });
      return;
    }
    case JobKind::kRelease: {
      absl::Status s = aggregators_.ReleaseTask(job.aggregator, job.task,
                                                clock_.Now() + options_.aggregator_call_timeout);
      if (!s.ok())
        LogWarning("task ", job.task, ": release at ", job.aggregator, ": ", s.message());
      return;
    }
  }
}

void CoordinatorCore::FinishJob(const Job& job, const std::function<void(Task&, Outbox&)>& apply) {
  Outbox out;
  {
    InputLock lock(*this, out);
    Task& task = tasks_[job.task];
    task.job_in_flight = false;
    if (IsActive(task)) apply(task, out);  // a stopped task ignores late results
    Reconcile(out);
  }
  Flush();
}

void CoordinatorCore::OnOpenRoundDone(Task& task, const Job& job, const absl::Status& status,
                                      Outbox& out) {
  if (!status.ok()) {
    task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    if (status.code() == absl::StatusCode::kNotFound ||
        status.code() == absl::StatusCode::kFailedPrecondition) {
      // The aggregator lost the model (it restarted): restore or re-initialise it.
      task.has_model = false;
      absl::StatusOr<StoredCheckpoint> c = store_.GetCheckpoint(job.task, std::nullopt);
      if (c.ok() && c->version == task.status.model_version()) task.restore_from = *c;
    }
    Fail(task, "open round", status, out);
  } else {
    task.failures = 0;
    const absl::Time now = clock_.Now();
    task.round = Round{};
    task.round.number = job.round;
    task.round.started = now;
    task.round.deadline = now + absl::Seconds(task.status.spec().round_deadline_seconds());
    for (const std::string& id : job.open.expected_peers()) {
      if (task.peers.count(id)) task.round.expected.insert(id);
    }
    task.status.set_round(job.round);
    task.status.set_phase(v1::ROUND_PHASE_TRAINING);
    task.status.set_state(v1::TASK_STATE_RUNNING);
    task.status.set_message(
        absl::StrCat("round ", job.round, " training with ", task.round.expected.size(), " peers"));
    v1::CoordinatorEvent event;
    auto* started = event.mutable_round_started();
    event.set_task(job.task);
    started->set_round(job.round);
    started->set_model_version(task.status.model_version());
    started->set_round_batches(task.status.spec().round_batches());
    started->set_deadline_unix_ms(UnixMillis(task.round.deadline));
    for (const std::string& id : task.round.expected) SendTo(id, event, out);
    MarkChanged(task, out);
  }
}

void CoordinatorCore::OnCloseRoundDone(
    Task& task, const Job& job, const absl::StatusOr<aggregator::v1::CloseRoundResponse>& result,
    Outbox& out) {
  if (!result.ok()) {
    task.status.set_phase(v1::ROUND_PHASE_TRAINING);  // Advance() retries the close
    Fail(task, "close round", result.status(), out);
  } else {
    task.failures = 0;
    const absl::Time now = clock_.Now();
    v1::RoundSummary summary;
    summary.set_round(job.round);
    std::set<std::string> contributors(result->contributors().begin(),
                                       result->contributors().end());
    for (const std::string& id : contributors) summary.add_participants(id);
    for (const std::string& id : task.round.expected) {
      if (!contributors.count(id)) summary.add_dropped(id);
    }
    metrics_.peers_dropped.Increment(static_cast<double>(summary.dropped_size()));
    summary.set_mean_train_loss(result->mean_train_loss());
    summary.set_num_samples(result->num_samples());
    summary.set_model_version(result->version());
    summary.set_duration_ms(absl::ToInt64Milliseconds(now - task.round.started));
    *task.status.add_history() = summary;
    metrics_.rounds_completed.Increment();
    metrics_.round_duration.Observe(absl::ToDoubleSeconds(now - task.round.started));
    if (!contributors.empty()) metrics_.train_loss.Set(result->mean_train_loss());
    LogInfo("task ", job.task, ": round ", job.round, " closed: ", contributors.size(),
            " contributors, ", summary.dropped_size(), " dropped, loss ", result->mean_train_loss(),
            ", model version ", result->version());
    out.push_back([this, name = job.task, summary] {
      absl::Status s = store_.PutRound(name, summary);
      if (!s.ok()) LogError("task ", name, ": cannot persist round: ", s.message());
    });
    const bool new_version = result->version() != task.status.model_version();
    task.status.set_model_version(result->version());
    if (new_version) {
      jobs_.push_back(MakeJob(JobKind::kCheckpoint, job.task, task.status.aggregator(), job.round,
                              result->version()));
    }
    v1::CoordinatorEvent event;
    event.set_task(job.task);
    event.mutable_model_published()->set_round(job.round);
    event.mutable_model_published()->set_version(result->version());
    for (const std::string& id : task.peers) {
      ExpectEvaluation(task, id, result->version());
      SendTo(id, event, out);
    }
    task.round.expected.clear();
    task.round.pushed.clear();
    if (job.round >= task.status.spec().rounds()) {
      task.status.set_phase(v1::ROUND_PHASE_EVALUATING);
      task.eval_deadline =
          now + std::min(options_.final_eval_timeout,
                         absl::Seconds(task.status.spec().round_deadline_seconds()));
      task.status.set_message("evaluating the final model");
    } else {
      task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    }
    MarkChanged(task, out);
  }
}

void CoordinatorCore::OnRestoreDone(Task& task, const Job& job, const absl::Status& status,
                                    Outbox& out) {
  task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
  if (status.ok()) {
    task.failures = 0;
    task.has_model = true;
    task.restore_from.reset();
    task.status.set_model_version(job.checkpoint.version);
    LogInfo("task ", job.task, ": restored model version ", job.checkpoint.version, " at ",
            job.aggregator);
    MarkChanged(task, out);
  } else if (status.code() == absl::StatusCode::kFailedPrecondition) {
    // The aggregator kept running and holds a newer version; the next OpenRound tells whether
    // it is the one the checkpoint names (if not, the task fails after its retries, loudly).
    task.has_model = true;
    task.restore_from.reset();
    MarkChanged(task, out);
  } else {
    Fail(task, "restore checkpoint", status, out);
  }
}

}  // namespace shoal::coordinator
