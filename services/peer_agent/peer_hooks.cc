#include "services/peer_agent/peer_hooks.h"

#include <utility>

namespace shoal::peer {

std::function<void(const std::function<bool()>& keep_going)> BindAfterBatch(
    AfterBatchHook hook, const rpc::Wakeup& wakeup) {
  if (!hook) return nullptr;
  return [hook = std::move(hook), &wakeup](const std::function<bool()>& keep_going) {
    hook(wakeup, keep_going);
  };
}

}  // namespace shoal::peer
