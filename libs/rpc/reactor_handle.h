#pragma once

#include "absl/synchronization/mutex.h"

namespace shoal::rpc {

// Lets other threads call into a self-deleting gRPC server reactor safely. The reactor creates
// one handle (held by shared_ptr, so it may outlive the reactor) and calls Detach() from OnDone()
// instead of `delete this`. Run() forwards only while the reactor exists; no lock is held while
// the reactor runs (gRPC may run reactions inline), so the reactor is deleted by whichever of
// Detach() and the last in-progress Run() comes last. Thread-safe.
template <typename Reactor>
class ReactorHandle {
 public:
  explicit ReactorHandle(Reactor* reactor) : reactor_(reactor) {}

  template <typename Fn>
  void Run(Fn&& fn) {
    Reactor* reactor = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      ++busy_;
      reactor = reactor_;
    }
    fn(*reactor);
    Reactor* to_delete = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (--busy_ == 0 && done_) to_delete = reactor_;
    }
    delete to_delete;
  }

  void Detach() {
    Reactor* to_delete = nullptr;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      if (busy_ == 0) to_delete = reactor_;
    }
    delete to_delete;
  }

 private:
  absl::Mutex mu_;
  Reactor* const reactor_;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::rpc
