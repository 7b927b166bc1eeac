#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/partition.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_client.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

struct PeerAgentOptions {
  training::ShardSpec shard;
  std::string device = "cpu";
  // Bound of one aggregator call (a round's deadline may cut it shorter).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Total time spent retrying a model upload/download that has no round deadline.
  absl::Duration model_transfer_budget = absl::Seconds(60);
  // Used when a RoundStarted carries no deadline.
  absl::Duration default_round_budget = absl::Minutes(10);
  BackoffOptions retry_backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};
  size_t max_queued_events = 1024;

  absl::Status Validate() const;
};

// The peer's federated-sync logic (protos/shoal/coordinator/v1/session.proto and README.md,
// "Protocol: federated-sync"), and the host of the other modes' ModeRunners: takes coordinator
// events, trains with LibTorch through training::Trainer, talks to the aggregator through
// AggregatorClient and answers on the session through `send`. No gRPC here.
//
// Threading: OnEvent/OnDisconnected are called by the session reader thread and only queue; one
// worker thread owned by the agent processes the queue in order (train, push, pull, evaluate).
// A queued event that supersedes the current round (a newer RoundStarted, ModelPublished,
// TaskFinished, TaskAssigned, a lost session, Stop) makes training stop between batches.
// Thread-safe. Owned by the PeerServer; the collaborators must outlive it.
class PeerAgent {
 public:
  using SendFn = std::function<absl::Status(const coordinator::v1::PeerMessage&)>;
  // Called (from the worker) when the agent cannot go on, e.g. an unknown model was assigned.
  using FatalFn = std::function<void(const absl::Status&)>;

  static absl::StatusOr<std::unique_ptr<PeerAgent>> Create(
      PeerAgentOptions options, std::shared_ptr<const training::RawDataset> train,
      std::shared_ptr<const training::RawDataset> test, aggregator::AggregatorClient& aggregator,
      PeerClient& peers, SnapshotStore& snapshots, PeerMetrics& metrics, const Clock& clock,
      SendFn send, FatalFn fatal);
  ~PeerAgent();  // Stop()s
  PeerAgent(const PeerAgent&) = delete;
  PeerAgent& operator=(const PeerAgent&) = delete;

  // Queues an event from the coordinator (Welcome is applied at once: it sets the peer id).
  void OnEvent(const coordinator::v1::CoordinatorEvent& event) ABSL_LOCKS_EXCLUDED(mu_);
  // The session broke: abandon the current round; the coordinator re-assigns after reconnect.
  void OnDisconnected() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops training between batches and joins the worker. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  std::string peer_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // This peer's id and session token, for calls to the aggregator.
  aggregator::Caller Me() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Event {
    bool disconnected = false;
    coordinator::v1::CoordinatorEvent event;
    bool superseding = false;  // counted in queued_superseding_
    bool ends_task = false;    // counted in queued_task_ending_
  };
  // The task this peer works on (only the worker touches it).
  struct TaskState {
    coordinator::v1::TaskAssigned assigned;
    std::unique_ptr<training::Trainer> trainer;
    // The last global model known exactly (downloaded, uploaded), to avoid downloads.
    std::optional<uint64_t> global_version;
    tensor::FlatModel global;
    // True when the trainer's parameters equal `global` (not trained since).
    bool params_are_global = false;
  };

  PeerAgent(PeerAgentOptions options, std::shared_ptr<const training::RawDataset> train,
            std::shared_ptr<const training::RawDataset> test,
            aggregator::AggregatorClient& aggregator, PeerClient& peers, SnapshotStore& snapshots,
            PeerMetrics& metrics, const Clock& clock, SendFn send, FatalFn fatal);

  void WorkerLoop();
  void Handle(const Event& event);
  void HandleTaskAssigned(const coordinator::v1::TaskAssigned& m);
  void HandleInitializeModel(const std::string& task);
  void HandleRoundStarted(const std::string& task, const coordinator::v1::RoundStarted& m);
  void HandleModelPublished(const std::string& task, const coordinator::v1::ModelPublished& m);
  void HandleTaskFinished(const std::string& task, const coordinator::v1::TaskFinished& m);
  // Decentralized / gossip: creates the task's ModeRunner (task_ is set) and Start()s it.
  void StartRunner();
  // Destroys the current runner (on the worker), if any.
  void EndRunner() ABSL_LOCKS_EXCLUDED(runner_mu_);
  std::shared_ptr<ModeRunner> runner() ABSL_LOCKS_EXCLUDED(runner_mu_);

  // Makes the trainer hold global model `version` (downloads it unless cached).
  absl::Status LoadGlobal(uint64_t version, absl::Time deadline,
                          const std::function<bool()>& keep_going);
  // Runs `attempt(attempt_deadline)` until it succeeds, fails with a code other than
  // UNAVAILABLE / RESOURCE_EXHAUSTED, `deadline` passes or `keep_going` turns false.
  template <typename T>
  absl::StatusOr<T> Retry(absl::Time deadline, const std::function<bool()>& keep_going,
                          const std::function<absl::StatusOr<T>(absl::Time)>& attempt);
  void SendPeerError(const std::string& task, uint64_t round, const absl::Status& status);
  void Send(const coordinator::v1::PeerMessage& message);
  void PublishSnapshot(uint64_t version);

  // keep_going predicates for the worker.
  bool NotSuperseded() ABSL_LOCKS_EXCLUDED(mu_);
  bool TaskStillCurrent() ABSL_LOCKS_EXCLUDED(mu_);

  const PeerAgentOptions options_;
  const std::shared_ptr<const training::RawDataset> train_;
  const std::shared_ptr<const training::RawDataset> test_;
  aggregator::AggregatorClient& aggregator_;
  PeerClient& peers_;
  SnapshotStore& snapshots_;
  PeerMetrics& metrics_;
  const Clock& clock_;
  const SendFn send_;
  const FatalFn fatal_;

  mutable absl::Mutex mu_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  int queued_superseding_ ABSL_GUARDED_BY(mu_) = 0;  // RoundStarted, ModelPublished, ...
  int queued_task_ending_ ABSL_GUARDED_BY(mu_) = 0;  // TaskFinished, TaskAssigned, disconnect
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_id_ ABSL_GUARDED_BY(mu_);
  std::string session_token_ ABSL_GUARDED_BY(mu_);  // from the latest Welcome

  // The ModeRunner of the current decentralized/gossip task. The worker creates and destroys it
  // (destruction always on the worker); the reader thread calls Intercept/Supersedes under
  // runner_mu_ (both non-blocking). Lock order: runner_mu_ before mu_ is never needed; each is
  // taken alone.
  absl::Mutex runner_mu_;
  std::shared_ptr<ModeRunner> runner_ ABSL_GUARDED_BY(runner_mu_);
  std::string runner_task_ ABSL_GUARDED_BY(runner_mu_);

  std::optional<TaskState> task_;  // worker thread only
  std::thread worker_;
};

}  // namespace shoal::peer
