#include "services/coordinator/modes/aggregator_mode_task.h"

#include "absl/strings/str_cat.h"
#include "libs/task/task_file.h"

namespace shoal::coordinator {

AggregatorModeTask::AggregatorModeTask(const v1::TaskStatus& status, const ModeOptions& options,
                                       CoordinatorMetrics& metrics)
    : task_(status.spec().name()),
      spec_(status.spec()),
      options_(options),
      metrics_(metrics),
      model_(task_, absl::Seconds(spec_.round_deadline_seconds())),
      retry_(task_, options, metrics) {}

void AggregatorModeTask::AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
                                 ModeEffects& fx) {
  peers_.insert(peer.id);
  if (!peer.identity_public_key.empty()) {
    identity_keys_[peer.id] = peer.identity_public_key;
  } else {
    identity_keys_.erase(peer.id);
  }
  waiting_.Joined(peer.id);
  Advance(now, status, fx);
}

void AggregatorModeTask::RemovePeer(const std::string& peer_id, const std::string& why,
                                    absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  peers_.erase(peer_id);
  identity_keys_.erase(peer_id);
  Advance(now, status, fx);
}

absl::Status AggregatorModeTask::OnMessage(const std::string& peer_id,
                                           const v1::PeerMessage& message, absl::Time now,
                                           v1::TaskStatus& status, ModeEffects& fx) {
  switch (message.kind_case()) {
    case v1::PeerMessage::kEvalReport:
      Advance(now, status, fx);  // the final evaluation may be complete
      return absl::OkStatus();
    case v1::PeerMessage::kModelInitialized: {
      if (absl::Status s = model_.OnInitialized(peer_id, status); !s.ok()) return s;
      status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
      fx.changed = true;
      Advance(now, status, fx);
      return absl::OkStatus();
    }
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("task \"", task_, "\" (",
                       task::FriendlyEnumName(*common::v1::Mode_descriptor(), spec_.mode()),
                       ") does not take this message"));
  }
}

void AggregatorModeTask::Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  Advance(now, status, fx);
}

void AggregatorModeTask::OnAggregator(const std::string& address, absl::Time now,
                                      v1::TaskStatus& status, ModeEffects& fx) {
  has_aggregator_ = true;
  Reset(status);
  waiting_.Clear();  // the message said "waiting for an aggregator"
  retry_.Reset();
  fx.changed = true;
  Advance(now, status, fx);
}

void AggregatorModeTask::OnAggregatorLost(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  has_aggregator_ = false;
  Reset(status);
  status.set_message("waiting for an aggregator to register");
  fx.changed = true;
}

}  // namespace shoal::coordinator
