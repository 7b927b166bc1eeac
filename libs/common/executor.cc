#include "libs/common/executor.h"

#include <cstdlib>

#include "libs/common/log.h"

namespace shoal {

ThreadPool::ThreadPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() { Shutdown(); }

bool ThreadPool::TrySubmit(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (shutdown_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(fn));
  return true;
}

void ThreadPool::Shutdown() {
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

void ThreadPool::Loop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->shutdown_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // shut down and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

SerialQueue::~SerialQueue() {
  absl::MutexLock lock(&mu_);
  if (running_ || !queue_.empty()) {
    LogError("SerialQueue destroyed with work queued or running");
    std::abort();  // an invariant: the owner drains before destroying
  }
}

void SerialQueue::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    if (running_) return;  // the running item posts the next one
    running_ = true;
  }
  if (!executor_.TrySubmit([this] { RunNext(); })) RunNext();
}

void SerialQueue::RunNext() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        running_ = false;
        return;
      }
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        running_ = false;
        return;
      }
    }
    // More to do: give other owners' work a turn on the pool (running_ stays set, so nothing
    // else starts this queue meanwhile); go on here only when the pool is full.
    if (executor_.TrySubmit([this] { RunNext(); })) return;
  }
}

void SerialQueue::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](SerialQueue* q)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return !q->running_ && q->queue_.empty(); },
      this));
}

bool SerialQueue::idle() const {
  absl::MutexLock lock(&mu_);
  return !running_ && queue_.empty();
}

}  // namespace shoal
