#include "services/coordinator/coordinator_core.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/task/task_file.h"
#include "libs/task/task_mode.h"
#include "services/coordinator/hello_check.h"
#include "services/coordinator/peer_data.h"
#include "services/coordinator/task_names.h"

namespace shoal::coordinator {
namespace {

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

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorCore>> CoordinatorCore::Create(
    CoordinatorOptions options, TaskStore& store, aggregator::AggregatorClient& aggregators,
    CoordinatorExecutors executors, Clock& clock, CoordinatorMetrics& metrics) {
  std::unique_ptr<CoordinatorCore> core(
      new CoordinatorCore(options, store, aggregators, executors, clock, metrics));
  if (core->placement_ != nullptr) return core;  // its tasks come through AdoptTask
  SHOAL_ASSIGN_OR_RETURN(std::vector<StoredTask> stored,
                         store.LoadTasks(options.history_in_memory));
  absl::MutexLock lock(&core->mu_);
  std::sort(stored.begin(), stored.end(), [](const StoredTask& a, const StoredTask& b) {
    return a.status.created_unix_ms() < b.status.created_unix_ms();
  });
  for (StoredTask& s : stored) {
    core->RestoreTask(std::move(s), "resuming after a coordinator restart");
  }
  return core;
}

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, TaskStore& store,
                                 aggregator::AggregatorClient& aggregators,
                                 CoordinatorExecutors executors, Clock& clock,
                                 CoordinatorMetrics& metrics)
    : options_(options),
      store_(store),
      placement_(store.placement()),
      aggregators_(aggregators),
      executors_(executors),
      clock_(clock),
      metrics_(metrics),
      work_(aggregators, store, executors.calls, executors.transfers, clock, metrics, options.work),
      store_writes_(executors.store),
      pool_(options.aggregator_ttl) {
  constexpr int kDialQueues = 2;  // of the 4 call threads: aggregator calls never wait long
  for (int i = 0; i < kDialQueues; ++i) {
    dial_queues_.push_back(std::make_unique<SerialQueue>(executors.calls));
  }
}

CoordinatorCore::~CoordinatorCore() {
  std::vector<std::unique_ptr<aggregator::AggregatorWatch>> watches;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [name, task] : tasks_) {
      for (Task::Link& link : task.links) {
        if (link.watch != nullptr) watches.push_back(std::move(link.watch));
      }
    }
    for (auto& w : retired_watches_) watches.push_back(std::move(w));
    retired_watches_.clear();
  }
  watches.clear();  // outside the lock: their callbacks take it
  for (auto& queue : dial_queues_) queue->Drain();
  // A flush that went on on the store's queue may post aggregator work, and work that finishes
  // may flush a store write: the store's queue, the work, then the store's queue again.
  store_writes_.Drain();
  work_.Drain();
  store_writes_.Drain();
}

CoordinatorCore::InputLock::InputLock(CoordinatorCore& core, Outbox& out) : core_(core), out_(out) {
  core_.mu_.Lock();
}

CoordinatorCore::InputLock::~InputLock() {
  for (auto& fn : out_) core_.effects_.emplace_back(std::move(fn));
  out_.clear();
  core_.mu_.Unlock();
}

void CoordinatorCore::Flush() {
  {
    absl::MutexLock lock(&mu_);
    if (flushing_) return;  // the thread flushing now runs ours too (or we are inside it)
    flushing_ = true;
  }
  FlushHeld(/*on_store=*/false);
}

void CoordinatorCore::FlushHeld(bool on_store) {
  for (;;) {
    std::optional<Effect> effect;
    {
      absl::MutexLock lock(&mu_);
      if (effects_.empty()) {
        flushing_ = false;
        return;
      }
      effect.emplace(std::move(effects_.front()));
      effects_.pop_front();
    }
    if (effect->stored && !on_store) {
      // flushing_ stays set: the store's thread goes on with the rest once it has written.
      store_writes_.Post([this, run = std::move(effect->run)] {
        run();
        FlushHeld(/*on_store=*/true);
      });
      return;
    }
    effect->run();
  }
}

void CoordinatorCore::WhenStored(std::function<void()> done) {
  {
    // Behind every effect queued so far, so behind their store writes too.
    absl::MutexLock lock(&mu_);
    effects_.emplace_back([this, done = std::move(done)] { store_writes_.Post(done); });
  }
  Flush();
}

// --- Peers -------------------------------------------------------------------------------

absl::StatusOr<std::string> CoordinatorCore::Connect(const v1::Hello& hello,
                                                     const std::string& identity,
                                                     std::shared_ptr<PeerSink> sink) {
  SHOAL_RETURN_IF_ERROR(CheckHello(hello, identity));
  Outbox out;
  std::string id;
  {
    InputLock lock(*this, out);
    if (placement_ != nullptr && peers_.count(hello.name()) == 0) {
      // Shared tasks: a peer follows its task when it was handed over a moment ago, and goes
      // where an open task needs it otherwise.
      if (auto moved = handed_off_peers_.find(hello.name()); moved != handed_off_peers_.end()) {
        const auto& [task, when] = moved->second;
        if (tasks_.count(task) > 0 || clock_.Now() - when >= kFollowHandOff) {
          handed_off_peers_.erase(moved);  // the task is back here, or the peer's time is up
        } else {
          return absl::UnavailableError(absl::StrCat(
              "this peer's task \"", task,
              "\" moved to another coordinator a moment ago; ask the next coordinator"));
        }
      }
      if (std::optional<std::string> there = ElsewhereFor(hello.join_token())) {
        return absl::UnavailableError(absl::StrCat(
            "no task of this coordinator needs this peer; an open task is at coordinator ",
            *there));
      }
    }
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
    const std::string relay = hello.wants_relay() ? PickRelay(id, hello.lost_relay()) : "";
    // A peer that was moved to a relay (relay_fallback too) is taken without one when none is
    // registered, as it was before it was moved; one that needs a relay (--relay=auto) waits.
    if (hello.wants_relay() && relay.empty() && !hello.relay_fallback()) {
      return absl::FailedPreconditionError(
          "hello: the peer asks for a relay, and no aggregator is registered to relay for it yet");
    }
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
    // A reconnect from the same address keeps the reachability found before until the new
    // dial-back answers; the coordinator alone sets it.
    const common::v1::Reachability reachability =
        peer.hello.listen_address() == hello.listen_address() ? peer.hello.capacity().reachability()
                                                              : common::v1::REACHABILITY_UNKNOWN;
    peer.id = id;
    peer.hello = hello;
    if (!relay.empty()) peer.hello.set_listen_address(absl::StrCat(relay, "/", id));
    if (relay.empty()) peer.hello.set_wants_relay(false);  // not relayed (fallback without one)
    peer.hello.mutable_capacity()->set_reachability(reachability);
    const std::string capacity =
        hello.has_capacity() ? absl::StrCat("; ", capacity::Describe(peer.hello.capacity())) : "";
    peer.sink = sink;
    peer.redial_in = absl::ZeroDuration();
    peer.last_seen = clock_.Now();
    peer.since = peer.last_seen;
    peer.task = task;
    if (task.empty()) {
      idle_peers_.insert(id);
    } else {
      idle_peers_.erase(id);
    }
    peer.session_token = NewSessionToken();
    metrics_.peers_connected.Set(static_cast<double>(peers_.size()));
    v1::CoordinatorEvent welcome;
    welcome.mutable_welcome()->set_peer_id(id);
    welcome.mutable_welcome()->set_session_token(peer.session_token);
    welcome.mutable_welcome()->set_relay_address(relay);
    welcome.mutable_welcome()->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
    SendTo(id, std::move(welcome), out);
    if (!task.empty()) {
      // It keeps its task (with a new session token): tell it again so it reloads its state,
      // and its mode state starts over (it announces its model again, e.g. ModelHeld).
      Task& t = tasks_[task];
      if (t.secure_moments != nullptr) t.secure_moments->Reconnected(id);
      MembersChanged(t, id);
      SendTo(id, TaskAssignedEvent(t, id), out);
      RejoinMode(t, peer, "reconnected", out);
    }
    LogInfo("peer ", id, " connected (shard ", hello.shard_index(), "/", hello.shard_count(), ", ",
            hello.device().empty() ? "cpu" : hello.device(), capacity, ")");
    DialPeer(peer, out);
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
  idle_peers_.erase(peer_id);
  metrics_.peers_connected.Set(static_cast<double>(peers_.size()));
  LogInfo("peer ", peer_id, " left: ", why);
  if (!task_name.empty()) LeaveTask(tasks_[task_name], peer_id, why, out);
  SupernodeHostLeft(peer_id);
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
    auto reject = [&](const char* reason, absl::Status status) {
      metrics_.messages_rejected.Add({{"reason", reason}}).Increment();
      result = std::move(status);
    };
    switch (message.kind_case()) {
      case v1::PeerMessage::kHeartbeat:
        break;
      case v1::PeerMessage::kHello:
        reject("bad_message", absl::FailedPreconditionError("hello sent twice"));
        break;
      case v1::PeerMessage::KIND_NOT_SET:
        reject("bad_message", absl::InvalidArgumentError("empty message"));
        break;
      case v1::PeerMessage::kLeave:
        RemovePeer(peer_id, absl::StrCat("leave: ", message.leave().reason()), out);
        break;
      default: {
        // Every other message is about the peer's task, named once in `task`.
        auto t = tasks_.find(message.task());
        if (message.task() != peer.task || t == tasks_.end()) {
          reject("wrong_task", absl::FailedPreconditionError(absl::StrCat(
                                   "peer ", peer_id, " is not in task \"", message.task(), "\"")));
          break;
        }
        Task& task = t->second;
        if (message.has_error()) {
          LogWarning("peer ", peer_id, " reports an error in task ", message.task(), " round ",
                     message.error().round(), ": ", message.error().message());
          // It cannot take part: release it from the task so that nothing waits for it.
          peer.task.clear();
          idle_peers_.insert(peer_id);
          PeerFailed(task, peer_id, message.error().message(), out);
          break;
        }
        if (message.has_data_report()) {  // every mode: for TaskStatus.data
          if (absl::Status s = RecordPeerData(task.status, peer_id, message.data_report());
              !s.ok()) {
            reject("bad_message", s);
            break;
          }
          MarkMembershipChanged(task);
          break;
        }
        if (message.has_data_moments()) {  // every mode: normalization standardize
          if (absl::Status s = RecordMoments(task, peer_id, message.data_moments(), out); !s.ok()) {
            reject(absl::IsInvalidArgument(s) ? "bad_message" : "stale", s);
          }
          break;
        }
        if (message.has_eval_report()) {
          if (absl::Status s = CreditEvalReport(task, peer_id, message.eval_report()); !s.ok()) {
            reject("bad_message", s);
            break;
          }
          NotifyWatchers(task, out);  // only the history changed (stored by the next Step)
        }
        if (task.mode == nullptr || !IsActive(task)) {
          if (!message.has_eval_report()) {
            reject("stale", absl::FailedPreconditionError(
                                absl::StrCat("task \"", message.task(), "\" has ended")));
          }
          break;
        }
        ModeEffects fx;
        absl::Status s = task.mode->OnMessage(peer_id, message, clock_.Now(), task.status, fx);
        ApplyModeEffects(task, fx, out);
        if (!s.ok()) reject(absl::IsInvalidArgument(s) ? "bad_message" : "stale", s);
        break;
      }
    }
    Reconcile(out);
  }
  Flush();
  return result;
}

bool CoordinatorCore::Accepts(const Task& task) const {
  if (!IsActive(task) || task.mode == nullptr) return false;
  const uint32_t max = task.status.spec().max_participants();
  if (max != 0 && task.peers.size() >= max) return false;
  return !task.UsesAggregator() || !task.status.aggregator().empty();
}

void CoordinatorCore::AssignIdlePeers(Outbox& out) {
  // Runs after every input: when no task can take a peer, skip the walk over the idle peers.
  const bool any_room = std::any_of(task_order_.begin(), task_order_.end(),
                                    [&](const auto& name) { return Accepts(tasks_.at(name)); });
  if (!any_room) return;
  const absl::Time now = clock_.Now();
  for (auto idle = idle_peers_.begin(); idle != idle_peers_.end();) {
    const std::string& id = *idle;
    Peer& peer = peers_.at(id);
    for (const std::string& name : task_order_) {
      Task& task = tasks_[name];
      if (!Accepts(task) || !TokenAdmits(task.status.spec(), peer.hello.join_token())) continue;
      if (auto e = task.errored.find(id); e != task.errored.end() && now < e->second.retry_at) {
        continue;  // it failed in this task a moment ago
      }
      peer.task = name;
      task.peers.insert(id);
      PlacePeer(task, id, out);
      MembersChanged(task, id);
      SendTo(id, TaskAssignedEvent(task, id), out);
      LogInfo("peer ", id, " assigned to task ", name);
      MarkMembershipChanged(task);
      ModeEffects fx;
      task.mode->AddPeer(
          ModePeer{id, peer.hello.listen_address(), peer.hello.identity_public_key()}, clock_.Now(),
          task.status, fx);
      ApplyModeEffects(task, fx, out);
      break;
    }
    // Checked again rather than remembered: the task may have ended at once (Finish makes its
    // peers idle again).
    idle = peer.task.empty() ? std::next(idle) : idle_peers_.erase(idle);
  }
}

void CoordinatorCore::Reconcile(Outbox& out) {
  ReconcileAggregators(out);
  AssignIdlePeers(out);
  const absl::Time now = clock_.Now();
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task) || task.mode == nullptr) continue;
    ExpireSecureSteps(task, now, out);
    ModeEffects fx;
    task.mode->Tick(now, task.status, fx);
    ApplyModeEffects(task, fx, out);
  }
  SendDirtyMembers(out);
  std::map<std::string, double> by_state;
  std::map<std::string, double> by_mode;
  for (const auto& [name, task] : tasks_) {
    by_state[StateName(task.status.state())] += 1;
    if (IsActive(task)) by_mode[ModeName(task.status.spec().mode())] += task.peers.size();
  }
  for (const char* state : {"waiting", "running", "completed", "stopped", "failed"}) {
    metrics_.tasks.Add({{"state", state}}).Set(by_state[state]);
  }
  for (const task::ModeDefinition& mode : task::ModeDefinitions()) {
    metrics_.participants.Add({{"mode", mode.name}}).Set(by_mode[mode.name]);
  }
}

// --- Driver ------------------------------------------------------------------------------

void CoordinatorCore::SaveUnsaved() {
  Outbox out;
  {
    InputLock lock(*this, out);
    for (auto& [name, task] : tasks_) {
      SaveRounds(task);
      if (task.membership_dirty) MarkChanged(task, out);
    }
  }
  Flush();
}

void CoordinatorCore::Step() {
  Outbox out;
  std::vector<std::unique_ptr<aggregator::AggregatorWatch>> retired;
  {
    InputLock lock(*this, out);
    // The walks over every peer run at most once a second (10,000 peers: milliseconds under
    // the lock, ten times a second otherwise).
    const absl::Time now = clock_.Now();
    const bool walk = !peers_walked_ || now - *peers_walked_ >= absl::Seconds(1);
    if (walk) {
      peers_walked_ = now;
      ConvictSilentPeers(out);
      RedialPeers(out);
      if (placement_ != nullptr) SendIdlePeersElsewhere(out);
      DeleteExpiredTasks(out);
    }
    for (auto& [name, task] : tasks_) SaveRounds(task);
    Reconcile(out);
    RunElections(out);
    for (auto& [name, task] : tasks_) {
      if (task.membership_dirty) MarkChanged(task, out);
    }
    UpdateTreeMetrics();
    retired.swap(retired_watches_);
  }
  Flush();
  retired.clear();  // outside the lock: a watch's destructor waits for its callbacks
}

}  // namespace shoal::coordinator
