#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/data/dataset.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/rpc/retry.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/partition.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_client.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/peer_hooks.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

struct PeerAgentOptions {
  training::ShardSpec shard;
  std::string device = "cpu";
  // Where a task's relative TorchScript file is found (--model-dir); empty: the working
  // directory.
  std::string model_dir;
  // The peer's data directory (--data-dir): a task of formats idx, csv or image-folder reads
  // its files from here when it is assigned.
  std::string data_dir;
  // This peer's measured upload, bytes/s (ModeRunnerDeps::measured_upload); null: none.
  std::shared_ptr<const std::atomic<double>> measured_upload;
  // Where the federated modes keep the global model on disk (--scratch-dir; empty: TMPDIR, else
  // /tmp): ModeRunnerDeps::scratch_dir.
  std::string scratch_dir;
  // Where a decentralized peer keeps its model for a restart (--state-dir; empty: nowhere):
  // ModeRunnerDeps::state_dir.
  std::string state_dir;
  // Federated-sync (--evaluate-beside-training): ModeRunnerDeps::evaluate_beside_training.
  bool evaluate_beside_training = true;
  // Federated modes (--download-against-held): ModeRunnerDeps::download_against_held.
  bool download_against_held = false;
  size_t max_queued_events = 1024;
  // normalization standardize without the task's mean/std: how long the peer waits for the
  // federation's statistics (FederationStatistics) after sending its moments before it gives up
  // on the task (PeerError).
  absl::Duration statistics_timeout = absl::Minutes(10);
  // Empty in shoal-peer (peer_hooks.h): the update hooks go to every runner, after_batch to
  // every task's trainer, called with the agent's wakeup.
  PeerHooks hooks;
  // Secure aggregation: this session's identity key and its public half (ModeRunnerDeps).
  std::shared_ptr<const privacy::secagg::KeySigner> identity;
  std::string identity_public_key;

  absl::Status Validate() const;
};

// The mode-agnostic host of a peer's tasks: takes coordinator events, sets up training
// (training::Trainer) when a task is assigned, and runs the task through the ModeRunner the mode
// registry makes for its mode (mode_registry.h); the runner talks to the aggregator or the other
// peers and answers on the session through `send`, which stamps PeerMessage.task. No gRPC here.
//
// Threading: OnEvent/OnDisconnected are called by the session reader thread and only queue (an
// event of the current task goes through the runner's Intercept first); one worker thread owned
// by the agent processes the queue in order (task setup, and every runner call but Intercept and
// Supersedes). An event the runner says supersedes the current work (or any event while no
// runner of its task exists yet), a TaskFinished, a TaskAssigned, a lost session and Stop make
// the current work stop between steps; a TaskFinished, a TaskAssigned and a lost session also
// end what is bounded by the task (ModeRunnerDeps::task_current).
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
  void OnEvent(const coordinator::v1::CoordinatorEvent& event) ABSL_LOCKS_EXCLUDED(mu_, runner_mu_);
  // The session broke: abandon the current round; the coordinator re-assigns after reconnect.
  void OnDisconnected() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the current work between steps and joins the worker. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  std::string peer_id() const ABSL_LOCKS_EXCLUDED(mu_);

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
  };

  PeerAgent(PeerAgentOptions options, std::shared_ptr<const training::RawDataset> train,
            std::shared_ptr<const training::RawDataset> test,
            aggregator::AggregatorClient& aggregator, PeerClient& peers, SnapshotStore& snapshots,
            PeerMetrics& metrics, const Clock& clock, SendFn send, FatalFn fatal);

  void WorkerLoop();
  void Handle(const Event& event);
  void HandleTaskAssigned(const coordinator::v1::CoordinatorEvent& event);
  // The task's trainer on Fashion-MNIST (loaded at start) or on the task's own files, read from
  // options_.data_dir now.
  // Data that await the federation's statistics are standardised with those of `assigned`, or
  // else with those the coordinator sends after this peer's moments (AwaitStatistics).
  absl::StatusOr<std::unique_ptr<training::Trainer>> MakeTrainer(
      const coordinator::v1::TaskAssigned& assigned, const training::TrainerOptions& options);
  // Sends the moments of the training shard `rows` of `train` and waits for the task's
  // federation statistics. CANCELLED when the task stopped being current (a TaskAssigned or
  // TaskFinished queued, a lost session, Stop); DEADLINE_EXCEEDED after statistics_timeout.
  // With privacy.secure_aggregation the moments go masked (SecureMoments), the worker answering
  // the coordinator's steps (SecureStatistics) as they come while it waits.
  absl::StatusOr<common::v1::FederationStatistics> AwaitStatistics(
      const common::v1::TaskSpec& spec, const data::Dataset& train,
      const std::vector<int64_t>& rows);
  void HandleTaskFinished(const coordinator::v1::CoordinatorEvent& event);
  // Creates the task's ModeRunner through the registry (task_ is set) and Start()s it.
  void StartRunner();
  // Destroys the current runner (on the worker), if any.
  void EndRunner() ABSL_LOCKS_EXCLUDED(runner_mu_);
  std::shared_ptr<ModeRunner> runner() ABSL_LOCKS_EXCLUDED(runner_mu_);
  // Logs a task-level failure and reports it as PeerError{round 0}.
  void ReportTaskError(const std::string& task, const absl::Status& error);
  // Tells the coordinator what the task's trainer trains and evaluates on (DataReport).
  void SendDataReport();
  void Send(const coordinator::v1::PeerMessage& message);

  // keep_going predicates for the worker.
  bool NotSuperseded() ABSL_LOCKS_EXCLUDED(mu_);
  bool TaskStillCurrent() ABSL_LOCKS_EXCLUDED(mu_);
  std::string SessionToken() const ABSL_LOCKS_EXCLUDED(mu_);

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
  // Notified whenever NotSuperseded/TaskStillCurrent may turn false (an event queued, a lost
  // session, Stop), so that the runners' waits end at once.
  rpc::Wakeup wakeup_;

  mutable absl::Mutex mu_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  int queued_superseding_ ABSL_GUARDED_BY(mu_) = 0;  // see Event::superseding
  int queued_task_ending_ ABSL_GUARDED_BY(mu_) = 0;  // TaskFinished, TaskAssigned, disconnect
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_id_ ABSL_GUARDED_BY(mu_);
  std::string session_token_ ABSL_GUARDED_BY(mu_);  // from the latest Welcome
  // The latest FederationStatistics event and its task (taken by the reader, never queued).
  std::string statistics_task_ ABSL_GUARDED_BY(mu_);
  std::optional<common::v1::FederationStatistics> statistics_ ABSL_GUARDED_BY(mu_);
  // SecureStatistics events not yet answered (taken by the reader, answered by the worker).
  std::deque<coordinator::v1::CoordinatorEvent> statistics_steps_ ABSL_GUARDED_BY(mu_);

  // The ModeRunner of the current task. The worker creates and destroys it (destruction always
  // on the worker); the reader thread calls Intercept/Supersedes under runner_mu_ (both
  // non-blocking). runner_mu_ is taken before mu_ never: each is taken alone.
  absl::Mutex runner_mu_;
  std::shared_ptr<ModeRunner> runner_ ABSL_GUARDED_BY(runner_mu_);
  std::string runner_task_ ABSL_GUARDED_BY(runner_mu_);

  std::optional<TaskState> task_;  // worker thread only
  std::thread worker_;
};

}  // namespace shoal::peer
