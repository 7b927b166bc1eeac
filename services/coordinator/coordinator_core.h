#pragma once

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
#include "services/aggregator/aggregator_client.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/task_store.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

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

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(2);
  int missed_heartbeats = 3;  // a peer silent this many intervals is declared crashed
  absl::Duration aggregator_ttl = absl::Seconds(15);  // unregistered after this silence
  absl::Duration retry_initial = absl::Milliseconds(250);
  absl::Duration retry_max = absl::Seconds(5);
  int max_aggregator_failures = 20;  // consecutive failures of one step before the task fails
  absl::Duration final_eval_timeout = absl::Seconds(60);
  absl::Duration aggregator_call_timeout = absl::Seconds(10);  // OpenRound, CloseRound, Release
  absl::Duration model_transfer_timeout = absl::Minutes(5);    // checkpoints and restores
};

// The coordinator's control plane: task registry, membership, the federated-sync round state
// machine and checkpoints. Tasks of other modes (decentralized, gossip) need no aggregator: each
// gets a ModeTask that the core drives under its lock (membership, their messages, timers) and
// whose ModeEffects it applies. Plain C++: no gRPC types beyond the protobuf messages.
//
// Inputs arrive from gRPC handlers (Connect, OnMessage, CreateTask, ...) and from the driver
// thread (Step). Outgoing aggregator calls are queued as jobs and run by Step() outside the lock;
// peer events and status updates are collected under the lock and delivered after it is released.
// Thread-safe.
class CoordinatorCore {
 public:
  // Loads the tasks kept in `store`; running tasks resume from their latest checkpoint.
  static absl::StatusOr<std::unique_ptr<CoordinatorCore>> Create(
      CoordinatorOptions options, TaskStore& store, aggregator::AggregatorClient& aggregators,
      Clock& clock, CoordinatorMetrics& metrics);

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
  // Errors: INVALID_ARGUMENT for a message that makes no sense (the stream stays open).
  absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message);

  // --- Aggregators (RegistryService) ---
  absl::Status RegisterAggregator(const std::string& address);
  absl::Duration heartbeat_interval() const { return options_.heartbeat_interval; }

  // --- Operators (ControlService) ---
  absl::StatusOr<v1::TaskStatus> CreateTask(const common::v1::TaskSpec& spec);
  std::vector<v1::TaskStatus> ListTasks() const;
  absl::StatusOr<v1::TaskStatus> GetTaskStatus(const std::string& name) const;
  absl::StatusOr<v1::TaskStatus> StopTask(const std::string& name);
  // Calls `callback` now and at every change of the task; returns a handle for Unwatch.
  absl::StatusOr<uint64_t> Watch(const std::string& name, StatusCallback callback);
  void Unwatch(uint64_t handle);
  // The checkpoint file of the task's latest (or given) model version.
  absl::StatusOr<StoredCheckpoint> GetCheckpoint(const std::string& name,
                                                 std::optional<uint64_t> version) const;

  // --- Driver ---
  // Runs timers (deadlines, heartbeats) and every queued aggregator job. Blocking; called in a
  // loop by the driver thread (and directly by tests).
  void Step();
  // Stores what Step() would store (round summaries updated by EvalReports) without running
  // timers or jobs; for shutdown.
  void SaveUnsaved();
  // Blocks until a job is queued or `timeout` passes (the driver's idle wait).
  void WaitForWork(absl::Duration timeout);

 private:
  struct Peer {
    std::string id;
    v1::Hello hello;
    std::string session_token;  // given in Welcome; aggregators accept its pushes only with it
    std::shared_ptr<PeerSink> sink;
    absl::Time last_seen;
    std::string task;  // assigned task, empty when idle
  };
  struct Round {
    uint64_t number = 0;
    absl::Time started;
    absl::Time deadline;
    std::set<std::string> expected;
    std::set<std::string> pushed;
  };
  struct Task {
    v1::TaskStatus status;  // history and everything reported; participants filled on read
    std::set<std::string> peers;
    bool has_model = false;     // the aggregator holds status.model_version
    bool members_dirty = true;  // the aggregator must learn the current peers and tokens
    bool job_in_flight = false;
    absl::Time retry_at = absl::InfinitePast();
    int failures = 0;
    std::string initializer;
    absl::Time init_deadline;
    Round round;
    // Model version -> the peers it was published to that have not reported its EvalReport yet.
    // A round's test_* are final (evaluation_complete) once its set is empty.
    std::map<uint64_t, std::set<std::string>> evaluating;
    // Rounds whose summary took EvalReports since it was last stored. Step() stores them, so a
    // round of N peers costs a few writes instead of N.
    std::set<uint64_t> unsaved_rounds;
    absl::Time eval_deadline;  // of the final round's evaluation
    std::optional<StoredCheckpoint> restore_from;
    std::string waiting_notice;  // last Waiting sent, to avoid repeats
    // Decentralized and gossip tasks: their state machine (no aggregator, no checkpoints).
    std::unique_ptr<ModeTask> mode;
  };
  enum class JobKind { kOpenRound, kCloseRound, kCheckpoint, kRestore, kRelease, kSetMembers };
  struct Job {
    JobKind kind = JobKind::kRelease;
    std::string task;
    std::string aggregator;
    uint64_t round = 0;
    uint64_t version = 0;
    aggregator::v1::OpenRoundRequest open;
    aggregator::v1::SetMembersRequest members;
    StoredCheckpoint checkpoint;
  };
  // Work to do after the lock is released: peer events, watcher updates, store writes.
  using Outbox = std::vector<std::function<void()>>;

  CoordinatorCore(CoordinatorOptions options, TaskStore& store,
                  aggregator::AggregatorClient& aggregators, Clock& clock,
                  CoordinatorMetrics& metrics);

  // Holds mu_ while one input is handled; on release (still under mu_) it queues the input's
  // outbox behind those of earlier inputs, so that peer events, watcher updates and store writes
  // happen in the order they were decided even when inputs race on several threads.
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
  // finds another one flushing leaves its effects to it).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // Evaluation bookkeeping (Task::evaluating): a peer was sent ModelPublished{version}; a peer
  // reported, left or failed; a version's evaluation is over (marks its history entry).
  void ExpectEvaluation(Task& task, const std::string& peer_id, uint64_t version);
  void EvaluationDone(Task& task, const std::string& peer_id, Outbox& out,
                      std::optional<uint64_t> version = std::nullopt);
  void CompleteEvaluation(Task& task, uint64_t version, Outbox& out);
  void SendTo(const std::string& peer_id, v1::CoordinatorEvent event, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The task changed: watchers get its status, the store its record (not its history).
  void MarkChanged(Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Only the watchers; for changes confined to the history, which the store keeps per round.
  void NotifyWatchers(const Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a store write of every round in task.unsaved_rounds.
  void SaveRounds(Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::TaskStatus StatusOf(const Task& task) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemovePeer(const std::string& peer_id, const std::string& why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reconcile(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AssignIdlePeers(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Advance(Task& task, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Task& task, v1::TaskState state, const std::string& message, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(Task& task, const std::string& step, const absl::Status& status, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static Job MakeJob(JobKind kind, const std::string& task, const std::string& aggregator,
                     uint64_t round = 0, uint64_t version = 0);
  void Enqueue(Task& task, Job job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PickAggregator() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsActive(const Task& task) const;
  // Applies what a ModeTask asked for: events, completed rounds, changes, the end of the task.
  void ApplyModeEffects(Task& task, ModeEffects& fx, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the task's ModeTask (if any) that a peer left it.
  void ModeRemovePeer(Task& task, const std::string& peer_id, const std::string& why, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void RunJob(const Job& job);
  // Applies a job's result to its task under the lock (unless the task ended meanwhile), then
  // reconciles and delivers.
  void FinishJob(const Job& job, const std::function<void(Task&, Outbox&)>& apply);
  void OnOpenRoundDone(Task& task, const Job& job, const absl::Status& status, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCloseRoundDone(Task& task, const Job& job,
                        const absl::StatusOr<aggregator::v1::CloseRoundResponse>& result,
                        Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRestoreDone(Task& task, const Job& job, const absl::Status& status, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  TaskStore& store_;
  aggregator::AggregatorClient& aggregators_;
  Clock& clock_;
  CoordinatorMetrics& metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> aggregator_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> task_order_ ABSL_GUARDED_BY(mu_);  // creation order
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> effects_ ABSL_GUARDED_BY(mu_);  // see InputLock
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::pair<std::string, StatusCallback>> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shoal::coordinator
