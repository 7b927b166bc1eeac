#include "services/peer_agent/peer_client.h"

#include <utility>

namespace shoal::peer {

void CallCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (abort_) abort_();
}

bool CallCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool CallCanceller::Attach(std::function<void()> abort) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  abort_ = std::move(abort);
  return true;
}

void CallCanceller::Detach() {
  absl::MutexLock lock(&mu_);
  abort_ = nullptr;
}

}  // namespace shoal::peer
