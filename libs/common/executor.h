#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace shoal {

// A fixed pool of threads with a bounded queue. Work that may block (disk, outgoing RPCs) runs
// here instead of inside a gRPC reaction. Thread-safe. Shutdown() (or the destructor) runs what
// is queued and joins the threads.
class Executor {
 public:
  Executor(size_t threads, size_t max_queued);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `fn`. Returns false, without running it, when the queue is full or shut down: the
  // caller answers RESOURCE_EXHAUSTED (or UNAVAILABLE) instead of waiting.
  bool TrySubmit(std::function<void()> fn);

  void Shutdown();

 private:
  void Loop();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace shoal
