#include "services/coordinator/modes/waiting_notice.h"

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

bool WaitingNotice::Update(const std::set<std::string>& peers, uint32_t need, absl::Time now,
                           v1::TaskStatus& status, ModeEffects& fx) {
  v1::CoordinatorEvent event;
  event.mutable_waiting()->set_have(static_cast<uint32_t>(peers.size()));
  event.mutable_waiting()->set_need(need);
  const bool changed = !told_ || told_have_ != peers.size() || told_need_ != need;
  if (changed && now - told_at_ >= interval_) {
    for (const std::string& id : peers) fx.Send(id, event);
    told_ = true;
    told_have_ = peers.size();
    told_need_ = need;
    told_at_ = now;
    status.set_state(v1::TASK_STATE_WAITING);
    status.set_message(absl::StrCat("waiting for peers: have ", peers.size(), ", need ", need));
    fx.changed = true;
    joined_.clear();
    return true;
  }
  for (const std::string& id : joined_) {
    if (peers.contains(id)) fx.Send(id, event);
  }
  joined_.clear();
  return false;
}

void WaitingNotice::Clear() {
  joined_.clear();
  told_ = false;
}

}  // namespace shoal::coordinator
