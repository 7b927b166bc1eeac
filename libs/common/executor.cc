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

// Shared by the queue and the runs in flight on the executor, so that a run may return after the
// queue was destroyed (see SerialQueue).
struct SerialQueue::State : std::enable_shared_from_this<State> {
  explicit State(Executor& e) : executor(e) {}
  void RunNext();
  bool Submit() {
    return executor.TrySubmit([self = shared_from_this()] { self->RunNext(); });
  }

  Executor& executor;
  mutable absl::Mutex mu;
  std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
  bool running ABSL_GUARDED_BY(mu) = false;
};

SerialQueue::SerialQueue(Executor& executor) : state_(std::make_shared<State>(executor)) {}

SerialQueue::~SerialQueue() {
  if (!idle()) {
    LogError("SerialQueue destroyed with work queued or running");
    std::abort();  // an invariant: the owner drains before destroying
  }
}

void SerialQueue::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->queue.push_back(std::move(fn));
    if (state_->running) return;  // the running item posts the next one
    state_->running = true;
  }
  if (!state_->Submit()) state_->RunNext();
}

void SerialQueue::State::RunNext() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu);
      if (queue.empty()) {
        running = false;
        return;
      }
      fn = std::move(queue.front());
      queue.pop_front();
    }
    fn();
    fn = nullptr;  // what it holds goes before the queue can be seen idle
    {
      absl::MutexLock lock(&mu);
      if (queue.empty()) {
        running = false;
        return;
      }
    }
    // More to do: give other owners' work a turn on the pool (running stays set, so nothing
    // else starts this queue meanwhile); go on here only when the pool is full.
    if (Submit()) return;
  }
}

void SerialQueue::Drain() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  s.mu.Await(absl::Condition(
      +[](State* q)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu) { return !q->running && q->queue.empty(); },
      &s));
}

bool SerialQueue::idle() const {
  absl::MutexLock lock(&state_->mu);
  return !state_->running && state_->queue.empty();
}

}  // namespace shoal
