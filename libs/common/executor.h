#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace shoal {

// Where blocking work (disk, outgoing RPCs, passes over a model) runs instead of a gRPC reaction
// or a caller holding a lock. Implementations are thread-safe. Tests use a manual executor
// (tests/fakes/manual_executor.h) that runs work when the test says so.
class Executor {
 public:
  virtual ~Executor() = default;
  // Queues `fn`. Returns false, without running it, when the executor is full or shut down: the
  // caller answers RESOURCE_EXHAUSTED (or UNAVAILABLE) instead of waiting.
  virtual bool TrySubmit(std::function<void()> fn) = 0;
};

// A fixed pool of threads with a bounded queue. Thread-safe. Shutdown() (or the destructor) runs
// what is queued and joins the threads.
class ThreadPool final : public Executor {
 public:
  ThreadPool(size_t threads, size_t max_queued);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  bool TrySubmit(std::function<void()> fn) override;
  void Shutdown();

 private:
  void Loop();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Runs what is posted to it one at a time, in the order posted, on an underlying executor: a
// "strand". Work of one owner (e.g. one task's aggregator calls) keeps its order while work of
// other owners runs beside it on the same pool. Unbounded: the owner bounds what it posts.
// Thread-safe. Destroying it while work is queued or running is a bug: Drain() first (or see
// idle()). Once idle it may be destroyed at once, even while the thread that ran its last item is
// still returning from it: that thread holds the queue's state, not the queue.
class SerialQueue {
 public:
  explicit SerialQueue(Executor& executor);
  ~SerialQueue();
  SerialQueue(const SerialQueue&) = delete;
  SerialQueue& operator=(const SerialQueue&) = delete;

  // Queues `fn` behind everything posted before. If the underlying executor refuses the first
  // item of a run, the item runs on the calling thread instead (never lost, never reordered).
  void Post(std::function<void()> fn);
  // Blocks until nothing is queued or running.
  void Drain();
  // Nothing queued or running.
  bool idle() const;

 private:
  struct State;

  std::shared_ptr<State> state_;
};

}  // namespace shoal
