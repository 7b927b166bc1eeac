#include "services/peer_agent/slow_batch.h"

namespace shoal::peer {

std::function<void(const std::function<bool()>& keep_going)> SlowBatchPause(
    absl::Duration delay, const rpc::Wakeup& wakeup) {
  if (delay <= absl::ZeroDuration()) return nullptr;
  return [delay, &wakeup](const std::function<bool()>& keep_going) {
    wakeup.SleepFor(delay, keep_going);
  };
}

}  // namespace shoal::peer
