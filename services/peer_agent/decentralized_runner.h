#pragma once

// Decentralized mode (Disco's round protocol without an aggregator), peer side. The protocol is
// in README.md ("Protocol: decentralized") and protos/shoal/coordinator/v1/session.proto.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

// One participant's update of a round, as averaged.
struct PeerUpdate {
  std::string peer_id;
  uint64_t num_samples = 0;
  std::shared_ptr<const tensor::FlatModel> model;
};

// The sample-weighted mean of `updates`: sum_j (n_j * x_j) / sum_j n_j per element, accumulated
// in double in ascending peer-id order whatever order `updates` is given in, so every
// participant computes a bit-identical result from the same updates. Errors: INVALID_ARGUMENT
// when there are no updates, a duplicate peer id, a missing model, a layout that differs from
// the first one, or zero total samples (an update with 0 samples counts with weight 0).
absl::StatusOr<tensor::FlatModel> AverageUpdates(std::vector<PeerUpdate> updates);

struct DecentralizedRunnerOptions {
  // One Probe attempt; a participant is unreachable after `probe_attempts` failed attempts.
  absl::Duration probe_timeout = absl::Seconds(2);
  int probe_attempts = 2;
  // One GetSnapshot attempt during sharing and model sync.
  absl::Duration fetch_timeout = absl::Seconds(30);
  // Total time a model sync keeps retrying (the task's round_deadline_seconds when set).
  absl::Duration sync_budget = absl::Seconds(60);
  BackoffOptions retry_backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};
  // After a ModelPublished that is not the last round's: how long to wait for the next
  // RoundOpen before evaluating (when it comes, the evaluation runs after this peer's JoinRound).
  absl::Duration next_round_grace = absl::Milliseconds(100);
};

// The peer side of one decentralized task. Holds the model of the last completed round it took
// part in (or synced to); per round: RoundOpen -> JoinRound, train, publish ROUND_UPDATE,
// RoundReady; PeerList -> probe the others in parallel -> ConnectionsReport; StartSharing or
// PeerList{sharing} -> fetch the others' ROUND_UPDATEs, AverageUpdates, load, publish GLOBAL,
// SharingDone; ModelPublished -> EvalReport; SyncFrom -> fetch the provider's GLOBAL, load,
// SyncDone, ModelHeld; JoinRefused / ConnectionFailed -> back to the pre-round model.
// Optimizer state stays local (reset after a sync).
// Threading: see ModeRunner (Supersedes() is stateless; everything else on the worker).
class DecentralizedRunner final : public ModeRunner {
 public:
  // Errors: INVALID_ARGUMENT when a dependency is missing or the task is not decentralized.
  static absl::StatusOr<std::unique_ptr<DecentralizedRunner>> Create(
      ModeRunnerDeps deps, DecentralizedRunnerOptions options = {});

  // Loads the seed's initial model (round 0) and sends ModelHeld.
  void Start() override;
  void Handle(const coordinator::v1::CoordinatorEvent& event,
              const std::function<bool()>& keep_going) override;
  // RoundOpen, JoinRefused, PeerList, StartSharing, ConnectionFailed, SyncFrom, TaskAssigned and
  // TaskFinished stop the current step (training, probing, fetching).
  bool Supersedes(const coordinator::v1::CoordinatorEvent& event) const override;

  // For tests: the completed round of the model held, and that model.
  uint64_t model_round() const { return model_round_; }
  const tensor::FlatModel& held() const { return held_; }

 private:
  // The round this peer takes part in (from RoundOpen until the next round or a refusal).
  struct RoundState {
    uint64_t round = 0;
    bool ready = false;  // trained and published its update
    uint64_t num_samples = 0;
    double train_loss = 0;
    int64_t train_ms = 0;
    std::shared_ptr<const tensor::FlatModel> update;  // this peer's trained weights
    std::map<std::string, PeerUpdate> fetched;        // other participants' updates
    std::optional<uint32_t> shared_attempt;           // last SharingDone sent
    tensor::FlatModel base;  // the model held before the round, once held_ is the average
  };

  DecentralizedRunner(ModeRunnerDeps deps, DecentralizedRunnerOptions options);

  void HandleRoundOpen(const coordinator::v1::RoundOpen& m,
                       const std::function<bool()>& keep_going);
  void HandlePeerList(const coordinator::v1::PeerList& m, const std::function<bool()>& keep_going);
  void Share(uint64_t round, uint32_t attempt, const std::function<bool()>& keep_going);
  // Evaluates the published model and sends EvalReport; when the next round is already queued
  // (keep_going false) the evaluation waits until this peer has sent that round's JoinRound.
  void HandleModelPublished(const coordinator::v1::ModelPublished& m,
                            const std::function<bool()>& keep_going);
  void RunPendingEval();
  void EvaluateAndReport(uint64_t round, uint64_t version);
  void HandleSyncFrom(const coordinator::v1::SyncFrom& m, const std::function<bool()>& keep_going);
  // Forgets the state of an older round this peer already averaged (its ModelPublished may not
  // have come), so that refusing `round` does not undo it.
  void DropCompletedRoundBefore(uint64_t round);
  // Drops the round and makes the trainer hold `held_` again (the pre-round model when the
  // round was already averaged here).
  void AbandonRound(const std::string& why);
  // Makes the trainer's parameters equal `held_` when training changed them.
  absl::Status RestoreHeld();
  void SendModelHeld();
  void SendError(uint64_t round, const absl::Status& status);
  void Send(const coordinator::v1::PeerMessage& message);
  // Sleeps `delay` in small steps; false as soon as keep_going() turns false.
  bool SleepWhile(absl::Duration delay, const std::function<bool()>& keep_going) const;

  const ModeRunnerDeps deps_;
  const DecentralizedRunnerOptions options_;
  const std::string task_;
  training::Trainer& trainer_;
  SnapshotStore& snapshots_;
  PeerClient& peers_;
  PeerMetrics& metrics_;
  const Clock& clock_;

  // Worker thread only.
  tensor::FlatModel held_;  // the averaged (or synced, or initial) model of model_round_
  uint64_t model_round_ = 0;
  bool params_are_held_ = false;                             // the trainer's parameters equal held_
  std::vector<coordinator::v1::PeerEndpoint> participants_;  // of the latest PeerList
  std::optional<RoundState> round_;
  struct PendingEval {
    uint64_t round = 0;
    uint64_t version = 0;
    tensor::FlatModel model;
  };
  std::optional<PendingEval> pending_eval_;  // evaluated right after the next JoinRound
};

}  // namespace shoal::peer
