#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "services/coordinator/modes/aggregator_mode_task.h"

namespace shoal::coordinator {

// The coordinator side of a federated-async task (README "Protocol: federated-async"): Disco's
// buffered asynchronous scheme (the FedBuff family) through the task's aggregator.
//
// Once the aggregator holds a model (GlobalModel) and min_participants peers are present, the
// mode opens the aggregator's update buffer (kOpenBuffer: buffer_size, staleness rule, strategy,
// last version = spec.rounds) and tells every peer TrainAsync: peers train and push at their own
// pace, never waiting for each other. The aggregator decides everything per update (staleness,
// replacement, when the buffer is full) and announces each version it publishes on its watch
// stream (VersionPublished). For each version the mode records a history entry (its "round" is
// the version), checkpoints it and publishes it for evaluation (ModelPublished; a peer may skip
// versions). After the last version it waits for the final evaluation, then completes.
//
// Losing the aggregator: on the next one the newest checkpoint is restored, the buffer is opened
// again and every peer is told TrainAsync again. Owned by CoordinatorCore (one per task). Not
// thread-safe: driven under the core's lock.
class FederatedAsyncTask final : public AggregatorModeTask {
 public:
  FederatedAsyncTask(const v1::TaskStatus& status, const ModeOptions& options,
                     CoordinatorMetrics& metrics);

  void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
               ModeEffects& fx) override;
  void OnAggregatorEvent(const aggregator::v1::TaskEvent& event, absl::Time now,
                         v1::TaskStatus& status, ModeEffects& fx) override;
  void OnWorkDone(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                  ModeEffects& fx) override;

 private:
  void Advance(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) override;
  // The buffer is gone with the aggregator (or never opened): start over from the model.
  void Reset(v1::TaskStatus& status) override;
  void OnBufferOpened(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                      ModeEffects& fx);
  void OnVersion(const aggregator::v1::VersionPublished& v, absl::Time now, v1::TaskStatus& status,
                 ModeEffects& fx);
  v1::CoordinatorEvent TrainEvent(const v1::TaskStatus& status) const;
  // The per-peer view of task status (updates each peer contributed).
  void PublishPeers(v1::TaskStatus& status) const;

  bool opening_ = false;      // kOpenBuffer in flight
  bool buffer_open_ = false;  // peers train and push
  absl::Time last_version_at_;
  absl::Time eval_deadline_;
  std::map<std::string, uint64_t> contributions_;  // peer -> updates in published versions
};

}  // namespace shoal::coordinator
