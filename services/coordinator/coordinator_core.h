#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/common/executor.h"
#include "services/aggregator/aggregator_client.h"
#include "services/coordinator/aggregator_pool.h"
#include "services/coordinator/aggregator_work.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/core_task.h"
#include "services/coordinator/dialer.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/secure_statistics.h"
#include "services/coordinator/task_placement.h"
#include "services/coordinator/task_store.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// With shared tasks: how long after its task was handed over a peer asking here again is sent on
// to the next coordinator (CoordinatorCore::handed_off_peers_).
inline constexpr absl::Duration kFollowHandOff = absl::Minutes(1);
// How long an aggregator that says it holds a task deleted here is still told to free it
// (TasksToRelease): one that was cut off when the task ended hears of it once it is back.
inline constexpr absl::Duration kReleaseDeleted = absl::Minutes(10);

// Where the coordinator sends one peer's events: its Session stream. Implementations must not
// block (they queue) and must tolerate calls after the stream ended (they drop).
class PeerSink {
 public:
  virtual ~PeerSink() = default;
  virtual void Send(const v1::CoordinatorEvent& event) = 0;
  // Ends the stream with `status` (e.g. missed heartbeats, replaced by a reconnect).
  virtual void Close(const absl::Status& status) = 0;
};

// Receives task status snapshots for WatchTask. Must not block.
using StatusCallback = std::function<void(const v1::TaskStatus& status)>;
// A watch ends without a terminal status (its task moved to another coordinator).
using WatchEndCallback = std::function<void(const absl::Status& why)>;

// Supernodes elected among the peers that offer to host one (Hello.supernode); see
// docs/explanation/elections.md.
struct SupernodeOptions {
  // An elected peer whose aggregator has not registered by then is passed over (for the rest of
  // its session).
  absl::Duration election_timeout = absl::Seconds(30);
  // Hysteresis: a task's tree is rebuilt (which reruns its current round) at most once per
  // interval, the first time at once.
  absl::Duration rebuild_interval = absl::Seconds(30);
  // A free node replaces a cluster's aggregator only with this many times its upload, or its
  // compute behind an upload not under half its (host_rank.h, ClearlyBetter).
  double better_factor = 2.0;
  // An elected supernode no task has used for this long is retired.
  absl::Duration retire_after = absl::Seconds(60);
};

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(2);
  int missed_heartbeats = 3;  // a peer silent this many intervals is declared crashed
  absl::Duration aggregator_ttl = absl::Seconds(15);  // unregistered after this silence
  // A task whose aggregator was lost while no other is registered waits this long for one to
  // register before it fails.
  absl::Duration aggregator_wait = absl::Minutes(10);
  // Rounds of each task's history kept in memory (and in TaskStatus.history); all of them stay
  // in the store (ControlService.ListRounds).
  size_t history_in_memory = 100;
  // An ended task (completed, failed or stopped) is deleted this long after it ended, with its
  // rounds, checkpoints and their files (--keep-ended-tasks); zero: kept until DeleteTask.
  absl::Duration keep_ended_tasks = absl::ZeroDuration();
  ModeOptions mode;
  AggregatorWorkOptions work;
  // Dials each peer's PeerService when it connects and again every `redial_interval` of its
  // session (zero: once per session), and each aggregator when it first registers, to set the
  // reachability in their Capacity; none: it stays unknown. A peer found unreachable that
  // accepts a relay (Hello.relay_fallback) is moved to one, on any of its dial-backs. A relayed
  // peer found unreachable is dialed again sooner: after 5 s, doubling up to redial_interval.
  Dialer* dialer = nullptr;
  absl::Duration dial_timeout = absl::Seconds(3);
  absl::Duration redial_interval = absl::Minutes(5);
  SupernodeOptions supernodes;
};

// Where the core's blocking work runs (tests pass manual executors and drive them by hand).
struct CoordinatorExecutors {
  Executor& calls;      // aggregator control calls (members, rounds, release)
  Executor& transfers;  // checkpoints and restores (whole models)
  Executor& store;      // SQLite writes, in order (a single-thread executor)
};

// The coordinator's control plane: task registry, membership, and the routing of each task's
// inputs to its ModeTask (services/coordinator/modes/<mode>/), which holds the task's state
// machine. The core knows no mode: for tasks whose mode uses an aggregator it picks one (and
// another when it is lost), keeps it told of the members and their session tokens, watches it
// (AggregatorService.WatchTask) and runs the mode's aggregator work. Plain C++: no gRPC types
// beyond the protobuf messages.
//
// Inputs arrive from gRPC handlers (Connect, OnMessage, CreateTask, ...), from watch streams
// and work results (executor threads) and from the driver thread (Step, which runs the timers).
// Each is handled under the lock; its effects (peer events, watcher updates) are delivered after
// the lock is released, in the order they were decided, and store writes and aggregator calls
// are handed to the executors: no input ever waits for SQLite, a disk or an aggregator.
// Thread-safe.
class CoordinatorCore {
 public:
  // Loads the tasks kept in `store`; running tasks resume (federated ones from their newest
  // checkpoint, restored on an aggregator by their mode). When the store's tasks are shared
  // among coordinators (TaskStore::placement), it loads none: each comes through AdoptTask.
  static absl::StatusOr<std::unique_ptr<CoordinatorCore>> Create(
      CoordinatorOptions options, TaskStore& store, aggregator::AggregatorClient& aggregators,
      CoordinatorExecutors executors, Clock& clock, CoordinatorMetrics& metrics);
  // Cancels the watch streams and waits for the aggregator work in flight.
  ~CoordinatorCore();

  // --- Peers (SessionService) ---
  // Registers a peer from its Hello; returns its id. `identity` is the common name of the
  // peer's verified TLS certificate ("" for plaintext): a peer may only use its own name, and
  // one without a name gets its certificate's. The peer gets a fresh session token in Welcome,
  // and is only assigned to tasks whose join token it presented. Errors: INVALID_ARGUMENT bad
  // Hello; PERMISSION_DENIED a name that is not the certificate's; UNAUTHENTICATED a join token
  // that no open task accepts while every open task needs one.
  absl::StatusOr<std::string> Connect(const v1::Hello& hello, const std::string& identity,
                                      std::shared_ptr<PeerSink> sink);
  // The peer's stream ended (cleanly or not). `sink` guards against a stale stream of a peer
  // that has already reconnected.
  void Disconnect(const std::string& peer_id, const PeerSink* sink);
  // Ends every peer's session with `status` (the coordinator is shutting down): the server's
  // shutdown then has no stream left to wait for until its deadline.
  void CloseSessions(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: FAILED_PRECONDITION for a message that does not fit (wrong task, stale),
  // INVALID_ARGUMENT for a malformed one (the stream stays open either way).
  absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message);

  // --- Aggregators (RegistryService) ---
  // `identity`: the name on its client certificate ("" without mutual TLS); `host_peer`: the
  // peer that runs it as an elected supernode ("" for a dedicated aggregator). Errors:
  // INVALID_ARGUMENT a malformed address; FAILED_PRECONDITION a host peer that is not connected
  // or was not elected.
  absl::Status RegisterAggregator(const std::string& address,
                                  const common::v1::Capacity& capacity = {},
                                  const std::string& identity = "",
                                  const std::string& host_peer = "");
  absl::Duration heartbeat_interval() const { return options_.heartbeat_interval; }
  // Of the tasks the aggregator at `address` says it holds, those it should free: this
  // coordinator's tasks that ended (or were deleted here in the last kReleaseDeleted), or that
  // no longer use it (not one of their aggregators or backups, nor one a restore may still
  // read). Tasks it does not serve are never named.
  std::vector<std::string> TasksToRelease(const std::string& address,
                                          const std::vector<std::string>& held) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Operators (ControlService; coordinator_core_operators.cc) ---
  // With shared tasks, the task goes to the least loaded coordinator (Claim).
  absl::StatusOr<v1::TaskStatus> CreateTask(const common::v1::TaskSpec& spec);
  // This coordinator's tasks, then (with shared tasks) the others' as they last stored them.
  std::vector<v1::TaskStatus> ListTasks() const;
  absl::StatusOr<v1::TaskStatus> GetTaskStatus(const std::string& name) const;
  absl::StatusOr<v1::TaskStatus> StopTask(const std::string& name);
  // Deletes `name`, an ended task: it leaves ListTasks and its watches end (NOT_FOUND) at once;
  // once the task's aggregator work and every store write decided so far are done, its records
  // leave the store, then its checkpoints' files, and `done` gets the store's answer (on the
  // store's queue). Until then a task of that name cannot be created (UNAVAILABLE); a delete
  // the store refused puts the task back as stored. Errors, without a call of `done`:
  // NOT_FOUND; FAILED_PRECONDITION for an open task.
  absl::Status DeleteTask(const std::string& name, std::function<void(const absl::Status&)> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `done` (on the store's queue) once every store write decided so far is done: the
  // control service answers an operator's change then, so that an acknowledged change survives
  // a crash or a fail-over.
  void WhenStored(std::function<void()> done) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `callback` now and at every change of the task; returns a handle for Unwatch. `ended`
  // (optional) is called instead of any further status when the task leaves this coordinator.
  absl::StatusOr<uint64_t> Watch(const std::string& name, StatusCallback callback,
                                 WatchEndCallback ended = nullptr);
  void Unwatch(uint64_t handle);
  // Whether a task of that name exists (NOT_FOUND otherwise); for handlers that then look up
  // its checkpoint in the store on an executor.
  absl::Status CheckTaskExists(const std::string& name) const;
  // The connected peers and the registered aggregators, with their capacity.
  v1::ListNodesResponse ListNodes() const;
  // SessionService.ListAggregators: at most `limit` registered aggregators, those serving the
  // fewest active tasks first (then by address).
  std::vector<std::string> AggregatorsToMeasure(size_t limit = 32) const;

  // --- Shared tasks (TaskPlacement) ---
  // Takes `name` over from the store (its owner key is this coordinator's now) and resumes it
  // as after a restart. Errors: the store's.
  absl::Status AdoptTask(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops serving `name`, an open task, for another coordinator to take it over (shared tasks:
  // TaskPlacement's hand-off): its status and rounds are stored, its peers' sessions and its
  // watches end (UNAVAILABLE; they find it again through the other coordinators), its aggregator
  // work is let finish, and then the placement releases it. Errors: NOT_FOUND, FAILED_PRECONDITION
  // for a task that is not open, a coordinator without shared tasks, stopping or fenced.
  absl::Status HandOffTask(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // A NOT_FOUND about a task, as the placement says it (shared tasks; reads etcd).
  absl::Status Routed(absl::Status status, const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

  // --- Driver ---
  // Runs the timers (heartbeats, deadlines, aggregator liveness) and releases retired watch
  // streams. Called periodically by the driver thread (and directly by tests).
  void Step();
  // Queues the store writes of what is still unsaved (round summaries updated by EvalReports,
  // which Step stores in batches); for shutdown, before the core is destroyed (which waits for
  // every queued write and call: the executors must keep running until then).
  void SaveUnsaved();

 private:
  // A peer's measured round trips, by aggregator address (microseconds).
  using RttMap = std::map<std::string, uint32_t>;
  struct Peer {
    std::string id;
    v1::Hello hello;
    std::string session_token;  // given in Welcome; aggregators accept its pushes only with it
    std::shared_ptr<PeerSink> sink;
    absl::Time last_seen;
    absl::Time since;      // this session's start
    absl::Time dialed_at;  // its latest dial-back (CoordinatorOptions::redial_interval)
    bool dialing = false;  // that dial-back has not answered yet: not dialed again meanwhile
    // Until the next dial-back: zero, redial_interval; for a relayed peer whose dial-back
    // failed, kRelayRedialFirst doubling up to redial_interval (its relay stream may be late).
    absl::Duration redial_in;
    std::string task;  // assigned task, empty when idle
    // Elected supernode before, and its aggregator never registered or was lost: not elected
    // again in this session.
    bool supernode_failed = false;
  };
  // A peer elected supernode: since when, and its aggregator once it registered.
  struct Elected {
    absl::Time since;
    std::string address;                     // "" until its aggregator registers
    std::optional<absl::Time> unused_since;  // no active task uses its aggregator
  };
  using Task = CoreTask;
  // Work to do after the lock is released: peer events, watcher updates.
  using Outbox = std::vector<std::function<void()>>;

  CoordinatorCore(CoordinatorOptions options, TaskStore& store,
                  aggregator::AggregatorClient& aggregators, CoordinatorExecutors executors,
                  Clock& clock, CoordinatorMetrics& metrics);

  // Holds mu_ while one input is handled; on release (still under mu_) it queues the input's
  // outbox behind those of earlier inputs, so that peer events and watcher updates happen in the
  // order they were decided even when inputs race on several threads.
  class InputLock {
   public:
    InputLock(CoordinatorCore& core, Outbox& out);
    ~InputLock();
    InputLock(const InputLock&) = delete;
    InputLock& operator=(const InputLock&) = delete;

   private:
    CoordinatorCore& core_;
    Outbox& out_;
  };
  // Runs the queued effects in order, outside the lock; one thread at a time (a thread that
  // finds another one flushing leaves its effects to it). At a store write the flush goes on
  // on the store's queue, so that no gRPC thread waits for the store and nothing queued after
  // the write happens before it.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // Flush's loop, by the thread that holds flushing_ (`on_store`: the store's queue).
  void FlushHeld(bool on_store) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Tasks (coordinator_core_tasks.cc) ---
  // Evaluation bookkeeping (Task::evaluating): a peer was sent ModelPublished{version}; a peer
  // reported version `up_to` (which settles the older versions it skipped), or left or failed
  // (every version); a version's evaluation is over (marks its history entry).
  void ExpectEvaluation(Task& task, const std::string& peer_id, uint64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvaluationDone(Task& task, const std::string& peer_id,
                      std::optional<uint64_t> up_to = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteEvaluation(Task& task, uint64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Credits an EvalReport to the newest round that produced its version.
  absl::Status CreditEvalReport(Task& task, const std::string& peer_id,
                                const v1::EvalReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendTo(const std::string& peer_id, v1::CoordinatorEvent event, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TaskAssigned for a peer of the task: the aggregator it calls is its cluster's.
  v1::CoordinatorEvent TaskAssignedEvent(const Task& task, const std::string& peer_id) const;
  // The task changed: watchers get its status, the store its record (not its history).
  void MarkChanged(Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its peers or their data reports changed: MarkChanged at the next Step (or sooner, with the
  // next other change).
  void MarkMembershipChanged(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    task.membership_dirty = true;
  }
  // Only the watchers; for changes confined to the history, which the store keeps per round.
  void NotifyWatchers(const Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StoreRound(const std::string& task, const v1::RoundSummary& round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the newest options_.history_in_memory rounds in memory (all stay in the store).
  void TrimHistory(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores every round in task.unsaved_rounds.
  void SaveRounds(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::TaskStatus StatusOf(const Task& task) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Task& task, v1::TaskState state, const std::string& message, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies what a ModeTask asked for: events, completed rounds, work, changes, the end.
  void ApplyModeEffects(Task& task, ModeEffects& fx, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A peer reported an error in `task`: it leaves it for a while; the task fails when all did.
  void PeerFailed(Task& task, const std::string& peer_id, const std::string& message, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a peer out of its task (it left, crashed or reported an error).
  void LeaveTask(Task& task, const std::string& peer_id, const std::string& why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsActive(const Task& task) const;
  // Ends the watches of `name` with `why`.
  void EndWatches(const std::string& name, const absl::Status& why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets an ended task here and queues its deletion from the store (DeleteTask); `done`
  // (optional) gets the store's answer.
  void DeleteEnded(const std::string& name, const char* by,
                   std::function<void(const absl::Status&)> done, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step: deletes the tasks that ended keep_ended_tasks ago or more.
  void DeleteExpiredTasks(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs a failed store write; a fenced one (FAILED_PRECONDITION: another coordinator holds
  // the store, or the task, now) sets fenced_.
  void CheckStoreWrite(const absl::Status& written, const std::string& task, const char* what);
  // Sets up a task read from the store: an active one resumes as after a restart, with
  // `message` as its status message until it runs again.
  void RestoreTask(StoredTask stored, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With shared tasks: the coordinator a peer with `join_token` should go to instead, if any:
  // one with an open task waiting for peers when no task here waits for them, else one with
  // any open task taking the peer when no task here does.
  std::optional<std::string> ElsewhereFor(const std::string& join_token) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With shared tasks: ends the sessions of idle peers that ElsewhereFor sends elsewhere, so
  // that they move on (their reconnection here is refused naming it).
  void SendIdlePeersElsewhere(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Federation statistics (coordinator_core_statistics.cc) ---
  // A peer's DataMoments: kept until min_participants present peers have sent theirs, then added
  // up into status.statistics, fixed for good and sent to every peer of the task. Once fixed,
  // the sender gets them at once. INVALID_ARGUMENT for malformed moments or a task whose peers
  // need none.
  absl::Status RecordMoments(Task& task, const std::string& peer_id, const v1::DataMoments& report,
                             Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With privacy.secure_aggregation: a step of the masking of the peers' moments
  // (SecureStatistics), which only ever shows the coordinator their sum.
  absl::Status RecordSecureMoments(Task& task, const std::string& peer_id,
                                   const v1::DataMoments& report, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the participants of the masking that have not answered its step by its deadline; the
  // others mask again. From Reconcile.
  void ExpireSecureSteps(Task& task, absl::Time now, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the peers the masking's steps.
  void SendSecureSteps(const Task& task, SecureStatistics::Effects& fx, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fixes `stats` as the task's statistics for good and sends them to every peer of the task.
  void FixStatistics(Task& task, common::v1::FederationStatistics stats, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Peers and reconciling (coordinator_core.cc) ---
  void RemovePeer(const std::string& peer_id, const std::string& why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reconcile(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AssignIdlePeers(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the task can take peers now (open, room, an aggregator if its mode needs one).
  bool Accepts(const Task& task) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Nodes and their capacity (coordinator_core_nodes.cc) ---
  // Queues a dial of a peer's (`aggregator` false; `session` its sink) or an aggregator's
  // address, whose result sets its reachability.
  // Hello.wants_relay: the aggregator that relays for `peer_id` (its previous relay while that is
  // registered, else the dedicated aggregator relaying for the fewest peers; `lost`, the relay the
  // peer lost, only when no other is registered); "" when none.
  std::string PickRelay(const std::string& peer_id, const std::string& lost) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DialBack(bool aggregator, const std::string& id, const std::string& address,
                const PeerSink* session, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DialBack of `peer` at its current address, now.
  void DialPeer(Peer& peer, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step: dials again the peers whose latest dial-back is `redial_interval` old.
  void RedialPeers(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step: declares crashed the peers silent for `missed_heartbeats` intervals, unless most of
  // the peers connected that long (and at least kMassSilence) are silent at once: then the
  // coordinator is behind (their heartbeats wait behind a reconnect storm's Hellos) or the
  // network is split, not the peers dead, and it holds off, for at most kMaxHoldLimits times
  // the silence limit. Broken streams are still noticed at once (Disconnect).
  void ConvictSilentPeers(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDialBack(bool aggregator, const std::string& id, const std::string& address,
                  const PeerSink* session, const absl::Status& status);
  // Hello.relay_fallback, after a dial-back that could not reach the peer: advertises it
  // through the relay PickRelay chooses (RelayAssigned), moves it in its task's mode to the new
  // address, and dials it there. False (nothing changed) when no aggregator can relay.
  bool MoveToRelay(Peer& peer, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The peer leaves its active task's mode (`why`) and joins it again at its current address:
  // its mode state starts over (after a reconnect, or a move to a relay).
  void RejoinMode(Task& task, const Peer& peer, const char* why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::NodeInfo PeerNode(const Peer& peer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::NodeInfo AggregatorNode(const std::string& address, const AggregatorPool::Entry& entry) const;

  // --- Aggregators (coordinator_core_aggregators.cc) ---
  // Gives every aggregator-backed task without an aggregator one (or fails it after waiting
  // too long).
  void ReconcileAggregators(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the member lists that changed (the last step of every input).
  void SendDirtyMembers(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rebuild`: the task had this aggregator already (its tree is being rebuilt); its peers are
  // told their aggregators again.
  void AssignAggregator(Task& task, const std::string& address, Outbox& out, bool rebuild = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The aggregator at `address` is gone (watch broke, registration expired): every task on it
  // moves to another one or waits.
  void LoseAggregator(const std::string& address, const std::string& why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends links[link] the members it serves.
  void SendMembers(Task& task, size_t link, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PostWork(Task& task, std::vector<AggregatorWork> work, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWatch(Task& task, size_t link, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The task's model is restored, or the task ended: frees it at the aggregators that held it
  // before (former_holders, holder_before_restart) but are not among its aggregators now.
  void ReleaseFormerHolders(Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The task's aggregator changed or the task ended: work results, watch events and member
  // answers of before are dropped (`epoch`), and so are the events held for them.
  void NewEpoch(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retires every link's watch and forgets the links.
  void DropLinks(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // --- Clusters of hierarchical tasks (coordinator_core_clusters.cc) ---
  // Puts a peer of the task in a cluster: the first one with room, else a new one on a
  // registered aggregator the task does not use (below the first aggregator with fewer than
  // fanout children), else the smallest (the root's own while it has no child). Flat tasks:
  // nothing. With the peer's measured round trips (Capacity.aggregator_rtts), "first" becomes
  // "nearest": among the clusters with room those it measured as near as the nearest
  // (NearAsNearest), and a new cluster when a free aggregator is clearly nearer than them.
  void PlacePeer(Task& task, const std::string& peer_id, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free aggregator for a new cluster of the task (pool_.Pick among those the task does not
  // use, restricted to those `rtts` measured as near as the nearest of them when it measured
  // any); "" when none.
  std::string PickNewCluster(const Task& task, const RttMap& rtts) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnplacePeer(Task& task, const std::string& peer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The id an aggregator has as a child supernode: its certificate's name, with "@ADDRESS" when
  // other aggregators share that certificate; its address without TLS.
  std::string ChildId(const std::string& address) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The peer's membership changed: the root and its cluster's aggregator must learn it.
  void MembersChanged(Task& task, const std::string& peer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The aggregator a peer of the task calls ("" when the task has none).
  const std::string& AggregatorOf(const Task& task, const std::string& peer_id) const;
  // How many links of active tasks each aggregator serves (as a primary or a backup).
  std::map<std::string, size_t> AggregatorLoad() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every aggregator the task uses: its links and their backups.
  static std::set<std::string> AddressesOf(const Task& task);
  // Replicas: gives each cluster of a task with replicas > 1 its backups, from registered
  // aggregators the task does not use yet (as many as there are).
  void AssignBackups(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replicas: a backup taken from the cluster with the most, to serve a new cluster ("" when
  // no cluster has one).
  std::string TakeBackup(Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replicas: `address` (lost) is the primary of one of the task's clusters with a backup, which
  // takes over its round; or a backup, which is dropped. False when it is neither: the task
  // starts over on a new tree.
  bool FailOver(Task& task, const std::string& address, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the task's work runs on: the root, and the clusters below it.
  AggregatorTree TreeOf(const Task& task) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ShowClusters(const Task& task, v1::TaskStatus& status) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the tree gauges (clusters, depth) from the active tasks.
  void UpdateTreeMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // --- Elected supernodes (coordinator_core_supernodes.cc) ---
  // A registration naming `host_peer`: accepted from an elected, connected peer (the address it
  // had before, if another, is lost), and as a refresh of the address adopted before (its peer
  // may be reconnecting).
  absl::Status AdoptSupernode(const std::string& host_peer, const std::string& address, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elects peers when the tasks need more aggregators than are free (or a much better node is
  // there), rebuilds the trees that can use newly free ones, retires the unused. From Step().
  void RunElections(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The peer left: a pending election of it ends. An aggregator it hosts serves on until it is
  // lost itself (its watch breaks, its registration expires): it ends with a peer that dies,
  // and outlives a session that only broke.
  void SupernodeHostLeft(const std::string& peer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The aggregator at `address` is lost: if an elected peer hosted it, that election ends.
  void SupernodeLost(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many aggregators the task would use now (a root, and one per cluster_size peers).
  size_t AggregatorsWanted(const Task& task) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the task's tree should be rebuilt on the free aggregator `free` ("" when not).
  std::string RebuildReason(const Task& task, const std::string& free) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Inputs from executor and watch threads, for the task's aggregator `epoch`.
  void OnWorkDone(const std::string& task, uint64_t epoch, const WorkResult& result);
  void OnMembersSet(const std::string& task, uint64_t epoch, size_t link, uint64_t members,
                    const absl::Status& status);
  void OnAggregatorEvent(const std::string& task, uint64_t epoch,
                         const aggregator::v1::TaskEvent& event);
  void OnWatchDone(const std::string& task, uint64_t epoch, const std::string& address,
                   const absl::Status& status);

  const CoordinatorOptions options_;
  TaskStore& store_;
  TaskPlacement* const placement_;  // store_.placement(): null when this one serves every task
  // Set by the first fenced store write: this coordinator lost its hold, and no peer event or
  // aggregator work leaves it any more (it exits once its lease's renewal reports the loss).
  std::atomic<bool> fenced_{false};
  aggregator::AggregatorClient& aggregators_;
  CoordinatorExecutors executors_;
  Clock& clock_;
  CoordinatorMetrics& metrics_;
  AggregatorWorkRunner work_;
  SerialQueue store_writes_;
  // Dial-backs, a few at a time on the calls executor (a node that drops packets costs
  // dial_timeout, one that refuses at once); those still queued when the core stops are dropped.
  std::vector<std::unique_ptr<SerialQueue>> dial_queues_;

  mutable absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  // The connected peers with no task, in id order: AssignIdlePeers walks these instead of
  // every peer (with thousands of peers, a walk per input made joins quadratic).
  std::set<std::string> idle_peers_ ABSL_GUARDED_BY(mu_);
  AggregatorPool pool_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Elected> elected_ ABSL_GUARDED_BY(mu_);  // by peer id
  std::map<std::string, Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> task_order_ ABSL_GUARDED_BY(mu_);  // creation order
  // Tasks deleted here whose records are still being deleted from the store.
  std::set<std::string> deleting_ ABSL_GUARDED_BY(mu_);
  // Tasks deleted here, and when, for kReleaseDeleted (TasksToRelease).
  std::map<std::string, absl::Time> deleted_ ABSL_GUARDED_BY(mu_);
  // What Flush runs, in order (see InputLock). A store write (`stored`) runs on the store's
  // queue, and the effects after it wait for it: the flush moves to the store's thread.
  struct Effect {
    template <typename Fn>
    explicit Effect(Fn fn, bool stored = false) : run(std::move(fn)), stored(stored) {}
    std::function<void()> run;
    bool stored;
  };
  std::deque<Effect> effects_ ABSL_GUARDED_BY(mu_);
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  struct Watcher {
    std::string task;
    StatusCallback callback;
    WatchEndCallback ended;
  };
  std::map<uint64_t, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_work_ ABSL_GUARDED_BY(mu_) = 1;
  size_t next_dial_ ABSL_GUARDED_BY(mu_) = 0;
  // Since when ConvictSilentPeers holds off (most peers silent at once); unset when it does not.
  std::optional<absl::Time> silence_hold_since_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> peers_walked_ ABSL_GUARDED_BY(mu_);  // Step's latest liveness walk
  // With shared tasks: the peers of tasks handed over to another coordinator (peer id -> the
  // task, and when), for a minute. Such a peer asks here again first (its session was
  // welcomed here); it is sent on to the next coordinator, where its task is, instead of into
  // a task of this one (a decentralized task's model lives in its peers), until the minute is
  // up or the task is back here.
  std::map<std::string, std::pair<std::string, absl::Time>> handed_off_peers_ ABSL_GUARDED_BY(mu_);
  // Watch streams of tasks that moved or ended; destroyed by Step() outside the lock (their
  // destructor waits for their callbacks, which take the lock).
  std::vector<std::unique_ptr<aggregator::AggregatorWatch>> retired_watches_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::coordinator
