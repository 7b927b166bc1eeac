#pragma once

// Federated-sync mode, peer side: rounds through an aggregator. The protocol is in
// docs/explanation/federated-sync.md and protos/shoal/coordinator/v1/session.proto.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/secure_participant.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/modes/aggregator_peer.h"
#include "services/peer_agent/modes/federated_sync/background_evaluator.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

struct FederatedSyncOptions {
  // Bound of one aggregator call (a round's deadline may cut it shorter); one that moves a
  // model or an update gets its bytes at slowest_link on top.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Total time spent retrying a model upload/download that has no round deadline, at least one
  // attempt's bound (AggregatorCallOptions::slowest_link).
  absl::Duration model_transfer_budget = absl::Seconds(60);
  // Bytes per second of the slowest link a peer may sit behind (AggregatorCallOptions).
  double slowest_link = rpc::kSlowestLink;
  // Used when a RoundStarted carries no deadline.
  absl::Duration default_round_budget = absl::Minutes(10);
  // Secure aggregation: how long past the round's deadline the peer's SecureAggregate stream may
  // last (when a peer is missing, the steps after advertising run once the coordinator closes
  // the round at its deadline).
  absl::Duration secure_steps_budget = absl::Minutes(2);
  BackoffOptions retry_backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};

  absl::Status Validate() const;
};

// The peer side of one federated-sync task: InitializeModel -> upload the seed's model as
// version 0 (PutModel), ModelInitialized; RoundStarted -> take the LATEST snapshot down, load the
// round's global model (GetModel unless held), train round_batches batches (which frees the
// gradients when it ends), push the delta (PushUpdate: the aggregator tells the coordinator);
// ModelPublished -> load that version, publish it as the LATEST snapshot and hand that copy and
// the version on disk to the BackgroundEvaluator, which evaluates it on its own thread and sends
// the EvalReport while the worker goes on with the next round (pausing while the worker trains
// and pushes); with deps.evaluate_beside_training false
// (--evaluate-beside-training=false), evaluate the loaded model first, send the EvalReport, then
// publish the snapshot, all before the next round (no evaluator, no copy kept through training).
// Memory: LibTorch's parameters, gradients and momentum while training; parameters, momentum and
// one model (downloaded, or the delta being pushed, or the snapshot's copy, or the model an
// evaluation beside training reads back from disk) otherwise: at most 3x the model, with the
// evaluation beside training or without (BackgroundEvaluator; scripts/bench-memory). A repeated
// TaskAssigned of the task (the coordinator
// moved it to another aggregator) switches every following call to the new aggregator address.
// Aggregator calls are retried with capped backoff within the round's deadline (or the transfer
// budget) through AggregatorPeer::RetryCall. Owned by the agent, which makes it
// through the mode registry; the deps must outlive it. With privacy.secure_aggregation the delta
// goes through the aggregator's SecureAggregate instead of PushUpdate (SecurePush), masked with the
// round's other peers, whose identity keys RoundStarted lists. Threading: see ModeRunner
// (Supersedes() is stateless; everything else on the worker).
class FederatedSyncRunner final : public ModeRunner {
 public:
  // Errors: INVALID_ARGUMENT when a dependency is missing, the options are bad or the task is
  // not federated-sync.
  static absl::StatusOr<std::unique_ptr<FederatedSyncRunner>> Create(
      ModeRunnerDeps deps, FederatedSyncOptions options = {});

  void Start() override;
  void Handle(const coordinator::v1::CoordinatorEvent& event,
              const std::function<bool()>& keep_going) override;
  // RoundStarted, ModelPublished, TaskAssigned and TaskFinished stop the current round.
  bool Supersedes(const coordinator::v1::CoordinatorEvent& event) const override;

 private:
  FederatedSyncRunner(ModeRunnerDeps deps, FederatedSyncOptions options,
                      std::unique_ptr<BackgroundEvaluator> evaluator);

  void HandleRoundStarted(const coordinator::v1::RoundStarted& m,
                          const std::function<bool()>& keep_going);
  void HandleModelPublished(const coordinator::v1::ModelPublished& m);
  // Pushes `delta` trained in round `m`. Returns the aggregator's "duplicate" flag, or nullopt
  // when the update was not accepted (already logged and reported).
  std::optional<bool> Push(const coordinator::v1::RoundStarted& m,
                           const training::TrainStats& stats,
                           std::shared_ptr<const tensor::EncodedModel> delta, absl::Time deadline,
                           const std::function<bool()>& keep_going);
  // Secure aggregation (privacy.secure_aggregation): takes part in round `m`'s SecAgg+ with
  // `delta` (raw) through the aggregator's SecureAggregate; with backups, again at the next
  // aggregator (fresh keys) when one is unavailable. Returns false when its part ended with the
  // round done, nullopt otherwise (logged).
  std::optional<bool> SecurePush(const coordinator::v1::RoundStarted& m,
                                 const training::TrainStats& stats,
                                 const tensor::EncodedModel& delta, absl::Time deadline,
                                 const std::function<bool()>& keep_going);
  void Send(const coordinator::v1::PeerMessage& message) const;

  const ModeRunnerDeps deps_;
  const FederatedSyncOptions options_;
  const std::string task_;
  training::Trainer& trainer_;
  SnapshotStore& snapshots_;
  aggregator::AggregatorClient& aggregator_;
  PeerMetrics& metrics_;
  const Clock& clock_;
  // The aggregator, and the global model held exactly (to avoid downloads). Worker thread only.
  AggregatorPeer peer_;
  // Secure rounds' buffers, kept from round to round (no fresh pages each round). Worker thread.
  aggregator::SecureBuffers secure_buffers_;
  // Null when published models are evaluated before the next round trains
  // (deps.evaluate_beside_training false). Last: destroyed (stopped and joined) first, while what
  // it reports through is still here.
  const std::unique_ptr<BackgroundEvaluator> evaluator_;
};

// The registry's factory (mode_registry.cc): FederatedSyncRunner::Create with default options.
absl::StatusOr<std::unique_ptr<ModeRunner>> CreateFederatedSyncRunner(ModeRunnerDeps deps);

}  // namespace shoal::peer
