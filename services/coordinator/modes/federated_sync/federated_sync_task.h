#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "services/coordinator/modes/aggregator_mode_task.h"
#include "services/coordinator/modes/federated_sync/straggler_tracker.h"
#include "services/coordinator/round_budget.h"

namespace shoal::coordinator {

// The coordinator side of a federated-sync task (docs/explanation/federated-sync.md): FedAvg
// rounds through the task's aggregator.
//
// The aggregator must hold a model first (GlobalModel: the newest checkpoint, or the initial
// model a peer uploads). Then, with at least min_participants peers, a round opens
// (kOpenRound with every current peer expected, RoundStarted); it closes (kCloseRound) once the
// aggregator has accepted an update from every expected peer still in the task (its watch stream
// says whom: the one source of truth for who pushed) or at the round deadline; the new version
// is checkpointed and published (ModelPublished, which peers evaluate), and the next round
// opens. After the last round the task waits for the final evaluation, then completes.
//
// Stragglers (straggler_factor): after each round StragglerTracker moves a peer that keeps
// holding the rounds up to asynchronous contribution, and back once it keeps pace. An async peer
// is not waited for: it is a round's late peer (OpenRoundRequest.late_peers), gets RoundStarted
// (with a deadline of max_staleness + 1 rounds) only while idle, and no ModelPublished while it
// trains (that would stop its training); its update goes into whatever round is open when it
// arrives, scaled by its staleness.
//
// Losing the aggregator abandons the round in flight; on the next aggregator the newest
// checkpoint is restored and that round runs again. Failed calls are retried (CallRetry).
//
// Owned by CoordinatorCore (one per task). Not thread-safe: driven under the core's lock.
class FederatedSyncTask final : public AggregatorModeTask {
 public:
  FederatedSyncTask(const v1::TaskStatus& status, const ModeOptions& options,
                    CoordinatorMetrics& metrics);

  void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                  v1::TaskStatus& status, ModeEffects& fx) override;
  void OnAggregatorEvent(const aggregator::v1::TaskEvent& event, absl::Time now,
                         v1::TaskStatus& status, ModeEffects& fx) override;
  void OnWorkDone(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                  ModeEffects& fx) override;

 private:
  struct Round {
    uint64_t number = 0;
    absl::Time started;
    absl::Time deadline;
    // The peers expected when it opened (RoundStarted.expected_peers: the n of DP's
    // distributed noise and the aggregator's fixed denominator).
    uint32_t opened_with = 0;
    std::set<std::string> expected;  // peers the round waits for (those still in the task)
    std::set<std::string> accepted;  // from the aggregator's watch stream
    // Each accepted update as seen live (not those accepted before a restart): when it
    // arrived after the round's open, the peer's training time and the update's bytes.
    struct Accepted {
      absl::Duration after;
      int64_t train_ms = 0;
      uint64_t bytes = 0;
    };
    std::map<std::string, Accepted> accepted_pushes;
    // Async peers when the round opened (OpenRoundRequest.late_peers): their updates are late.
    std::set<std::string> late_peers;
    // Secure aggregation: for each expected peer, the identity public keys of its secure round's
    // participants (RoundStarted.identity_keys): every expected peer's, or on a tree its
    // cluster's.
    std::map<std::string, std::map<std::string, std::string>> identity_keys;
  };

  // Takes the next step the state allows (restore, initialize, open, close, finish).
  void Advance(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) override;
  void Ask(AggregatorWork::Kind kind, AggregatorWork work, ModeEffects& fx);
  // The aggregator holds nothing we know of (new aggregator, or it lost the task): the round in
  // flight is abandoned and the newest checkpoint will be restored.
  void Reset(v1::TaskStatus& status) override;
  void OnOpened(const WorkResult& result, absl::Time now, v1::TaskStatus& status, ModeEffects& fx);
  void OnClosed(const WorkResult& result, absl::Time now, v1::TaskStatus& status, ModeEffects& fx);
  bool AllAccepted() const;
  // After a round closed: moves stragglers (StragglerTracker), logs and counts the moves.
  void JudgePace(v1::TaskStatus& status);
  // RoundStarted for the open round (round_) with `deadline`.
  v1::CoordinatorEvent RoundStartedEvent(const v1::TaskStatus& status, absl::Time deadline) const;
  // Sends RoundStarted for the open round to the async peers that are not training.
  void StartIdleAsyncPeers(absl::Time now, v1::TaskStatus& status, ModeEffects& fx);
  // Whether async `peer` trains now (was started and its deadline has not passed).
  bool Busy(const std::string& peer, absl::Time now) const;
  // Whether any async peer of the task trains now.
  bool AnyBusy(absl::Time now) const;
  // status.async_peers = the tracker's.
  void ShowAsyncPeers(v1::TaskStatus& status) const;
  // Whether the evaluation of the task's current model version is complete.
  static bool FinalEvaluationDone(const v1::TaskStatus& status);
  // The last round's model is out: the task completes once it is evaluated (or at the deadline).
  void EvaluateLast(absl::Time now, v1::TaskStatus& status);

  // The round call in flight (open, close); the mode waits for its result.
  std::optional<AggregatorWork::Kind> pending_;
  Round round_;
  absl::Time eval_deadline_;
  StragglerTracker stragglers_;
  common::v1::AsyncSpec late_staleness_;  // how late updates are bounded and scaled
  // Async peers training now: when their RoundStarted was sent, and its deadline (past it, the
  // peer has given up: a rejected or lost update).
  struct Training {
    absl::Time started;
    absl::Time deadline;
  };
  std::map<std::string, Training> busy_;
  // Async peers whose late update was accepted since the last close: the time it took.
  std::map<std::string, absl::Duration> late_times_;
  // privacy.dp: the rounds against the budget, and what the round being opened costs (from
  // budget_.Check when it was asked for), charged once the aggregator opened it.
  RoundBudget budget_;
  RoundCharge opening_charge_;
};

// The mode registry's factory (services/coordinator/mode_registry.cc).
std::unique_ptr<ModeTask> MakeFederatedSyncTask(const v1::TaskStatus& status,
                                                const ModeOptions& options,
                                                CoordinatorMetrics& metrics);

}  // namespace shoal::coordinator
