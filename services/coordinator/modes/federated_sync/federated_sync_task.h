#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "services/coordinator/modes/aggregator_mode_task.h"

namespace shoal::coordinator {

// The coordinator side of a federated-sync task (README "Protocol: federated-sync"): FedAvg
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
  // Whether the evaluation of the task's current model version is complete.
  static bool FinalEvaluationDone(const v1::TaskStatus& status);

  // The round call in flight (open, close); the mode waits for its result.
  std::optional<AggregatorWork::Kind> pending_;
  Round round_;
  absl::Time eval_deadline_;
  std::string waiting_notice_;  // last Waiting sent, to avoid repeats
};

}  // namespace shoal::coordinator
