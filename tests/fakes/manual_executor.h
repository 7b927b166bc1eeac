#pragma once

#include <deque>
#include <functional>

#include "absl/synchronization/mutex.h"
#include "libs/common/executor.h"

namespace shoal::fakes {

// An Executor that runs nothing until the test says so: RunAll() runs what is queued, and what
// that work queues in turn, on the calling thread, in order. Deterministic tests drive blocking
// work (aggregator calls, store writes) with it. Thread-safe.
class ManualExecutor final : public Executor {
 public:
  bool TrySubmit(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    return true;
  }
  // Runs until the queue is empty; returns how many items ran.
  int RunAll() {
    int ran = 0;
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        if (queue_.empty()) return ran;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
      ++ran;
    }
  }
  size_t pending() const {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::fakes
