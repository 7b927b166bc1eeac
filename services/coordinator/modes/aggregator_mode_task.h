#pragma once

#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/coordinator/global_model.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/modes/waiting_notice.h"

namespace shoal::coordinator {

// What the modes whose model lives on an aggregator (federated-sync, federated-async) share: the
// task's peers, whether an aggregator is there, the global model on it (GlobalModel), retried
// calls and checkpoints, and the reactions that do not depend on how updates are gathered
// (ticks, evaluation reports, the initial model, an aggregator gained or lost).
//
// A subclass takes the next step its state allows in Advance, and in Reset forgets what the
// aggregator held (the aggregator changed or went away). Not thread-safe: driven under the
// core's lock like every ModeTask.
class AggregatorModeTask : public ModeTask {
 public:
  void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
               ModeEffects& fx) override;
  void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                  v1::TaskStatus& status, ModeEffects& fx) override;
  // EvalReport and ModelInitialized; other messages are FAILED_PRECONDITION.
  absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message, absl::Time now,
                         v1::TaskStatus& status, ModeEffects& fx) override;
  void Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) final;
  void OnAggregator(const std::string& address, absl::Time now, v1::TaskStatus& status,
                    ModeEffects& fx) final;
  void OnAggregatorLost(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) final;

 protected:
  AggregatorModeTask(const v1::TaskStatus& status, const ModeOptions& options,
                     CoordinatorMetrics& metrics);

  virtual void Advance(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) = 0;
  virtual void Reset(v1::TaskStatus& status) = 0;

  const std::string task_;
  const common::v1::TaskSpec spec_;
  const ModeOptions options_;
  CoordinatorMetrics& metrics_;

  std::set<std::string> peers_;
  // Secure aggregation: each peer's identity public key (Hello.identity_public_key), when it
  // sent one.
  std::map<std::string, std::string> identity_keys_;
  bool has_aggregator_ = false;
  GlobalModel model_;
  CallRetry retry_;
  Checkpoints checkpoints_;
  WaitingNotice waiting_;  // while the task waits for min_participants
};

}  // namespace shoal::coordinator
