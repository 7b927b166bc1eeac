#pragma once

// Federated-async mode, peer side: train and push against the aggregator's buffer, again and
// again. The protocol is in docs/explanation/federated-async.md and in the comments of
// TrainAsync (protos/shoal/coordinator/v1/session.proto) and OpenBuffer
// (protos/shoal/aggregator/v1/aggregator.proto).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_client.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/modes/aggregator_peer.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

struct FederatedAsyncOptions {
  // Bound of one aggregator call; one that moves a model or an update gets its bytes at
  // slowest_link on top.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Total time one model download or one push keeps retrying (AggregatorPeer::RetryCall), at
  // least one attempt's bound (AggregatorCallOptions::slowest_link).
  absl::Duration transfer_budget = absl::Seconds(60);
  // Bytes per second of the slowest link a peer may sit behind (AggregatorCallOptions).
  double slowest_link = rpc::kSlowestLink;
  // After a refused or failed push, or a failed download: how long to wait for a newer version
  // (a ModelPublished) before going on, so that a peer that cannot get anywhere does not spin.
  absl::Duration retry_wait = absl::Seconds(5);
  BackoffOptions retry_backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};

  absl::Status Validate() const;
};

// The peer side of one federated-async task. TrainAsync{model_version, round_batches} starts the
// loop, which runs until a newer TrainAsync, TaskAssigned or TaskFinished supersedes it (or the
// agent stops):
//   1. take the newest version known: the newest ModelPublished since the last TrainAsync, at
//      least TrainAsync.model_version; make the trainer hold exactly that global model (GetModel
//      from the task's aggregator unless already held);
//   2. when a ModelPublished newer than the last version evaluated is known, evaluate the model
//      held and send one EvalReport for its version (which settles the older ones);
//   3. train round_batches batches; a stretch from the version of this peer's last push (none
//      newer was out) stops when a newer version is published, and the loop goes back to 1;
//   4. push the delta (trained − global, through the update hooks) with
//      UpdateMeta{round 0, base_version = the version trained from};
//   5. go back to 1: the parameters are reset to the newest global model, so every delta is
//      relative to a global version and no update is counted twice.
// A push refused with FAILED_PRECONDITION (too stale, or no buffer open) is counted and dropped;
// it and other failures wait up to retry_wait for a newer version before the next round.
// ModelPublished events are consumed on the session reader thread while the loop runs (they
// stop only the stretch of step 3 above, never a queue); when it does not run they are queued and
// evaluated. A repeated TaskAssigned switches every later call to the aggregator it names
// (forgetting the model held, whose version numbers belong to the old aggregator). Once started,
// the loop resumes after every event that stopped it (a TrainAsync restarts it with its settings);
// only the end of the task (the agent destroys the runner) ends it. Aggregator calls are retried
// through AggregatorPeer::RetryCall. Owned by the agent, which makes it through
// the mode registry; the deps must outlive it. Threading: Intercept() and Supersedes() on the
// session reader thread (they touch only the versions under mu_); everything else on the agent's
// worker thread.
class FederatedAsyncRunner final : public ModeRunner {
 public:
  // Errors: INVALID_ARGUMENT when a dependency is missing, the options are bad or the task is
  // not federated-async.
  static absl::StatusOr<std::unique_ptr<FederatedAsyncRunner>> Create(
      ModeRunnerDeps deps, FederatedAsyncOptions options = {});

  void Start() override;
  void Handle(const coordinator::v1::CoordinatorEvent& event,
              const std::function<bool()>& keep_going) override;
  // Notes the version of a ModelPublished and consumes it while the loop runs; notes that a
  // TrainAsync starts a new sequence of versions.
  bool Intercept(const coordinator::v1::CoordinatorEvent& event) override;
  // A TrainAsync stops the current loop (TaskAssigned and TaskFinished always do).
  bool Supersedes(const coordinator::v1::CoordinatorEvent& event) const override;

 private:
  // kNewerVersion: a speculative stretch (see Iterate) gave way to a newer version.
  enum class Outcome { kPushed, kNewerVersion, kRefused, kFailed, kStopped };

  FederatedAsyncRunner(ModeRunnerDeps deps, FederatedAsyncOptions options);

  void HandleTaskAssigned(const coordinator::v1::TaskAssigned& m);
  // Takes the loop's settings. False (reported) when they are unusable.
  bool HandleTrainAsync(const coordinator::v1::TrainAsync& m);
  // Before the first TrainAsync: loads and evaluates the newest published version.
  void HandleModelPublished(const std::function<bool()>& keep_going);
  // The loop (above) until keep_going turns false.
  void Run(const std::function<bool()>& keep_going);
  // Steps 1 to 4 once, from global version `version`.
  Outcome Iterate(uint64_t version, const std::function<bool()>& keep_going);
  // Step 4: pushes `delta` trained from `version`.
  Outcome Push(uint64_t version, const training::TrainStats& stats,
               std::shared_ptr<const tensor::EncodedModel> delta,
               const std::function<bool()>& keep_going);
  // The version to train from: the newest published, at least TrainAsync.model_version.
  uint64_t TargetVersion() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t NewestPublished() const ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the trainer hold global model `version` (downloads it unless held, and publishes a
  // download as the snapshot of that version).
  absl::Status LoadGlobal(uint64_t version, const std::function<bool()>& keep_going);
  // Step 2 for the model held (global version `version`).
  void MaybeEvaluate(uint64_t version);
  // Waits up to retry_wait until a version newer than `version` is published.
  void WaitForNewerThan(uint64_t version, const std::function<bool()>& keep_going);
  // Logs `error` and reports it as PeerError{round 0}, unless it repeats the last one reported.
  void ReportError(const absl::Status& error);
  void SetRunning(bool running) ABSL_LOCKS_EXCLUDED(mu_);

  const ModeRunnerDeps deps_;
  const FederatedAsyncOptions options_;
  const std::string task_;
  training::Trainer& trainer_;
  aggregator::AggregatorClient& aggregator_;
  PeerMetrics& metrics_;
  rpc::Wakeup& wakeup_;

  // Written by the reader thread (Intercept), read by the worker.
  mutable absl::Mutex mu_;
  // The newest version a ModelPublished named since the last TrainAsync (0: none).
  uint64_t newest_published_ ABSL_GUARDED_BY(mu_) = 0;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the loop runs (ModelPublished is consumed)

  // Worker thread only.
  // The aggregator, and the global model held exactly (to avoid downloads).
  AggregatorPeer peer_;
  std::optional<coordinator::v1::TrainAsync> train_;  // the latest TrainAsync
  uint64_t last_evaluated_ = 0;                       // the newest version evaluated (0: none)
  std::optional<uint64_t> last_pushed_base_;  // the version this peer's last accepted push used
  std::string last_error_;                    // the last error reported (not repeated)
};

// The registry's factory (mode_registry.cc): FederatedAsyncRunner::Create with default options.
absl::StatusOr<std::unique_ptr<ModeRunner>> CreateFederatedAsyncRunner(ModeRunnerDeps deps);

}  // namespace shoal::peer
