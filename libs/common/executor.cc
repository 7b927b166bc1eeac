#include "libs/common/executor.h"

namespace shoal {

Executor::Executor(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() { Shutdown(); }

bool Executor::TrySubmit(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (shutdown_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(fn));
  return true;
}

void Executor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_ && threads_.empty()) return;
    shutdown_ = true;
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void Executor::Loop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->shutdown_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // shut down and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace shoal
