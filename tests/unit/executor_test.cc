// ThreadPool and SerialQueue (libs/common/executor.h) on real threads.

#include "libs/common/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace shoal {
namespace {

// Refuses everything: a full pool.
class FullExecutor final : public Executor {
 public:
  bool TrySubmit(std::function<void()>) override { return false; }
};

TEST(SerialQueueTest, RunsEachQueuesItemsInOrderOneAtATimeBesideOtherQueues) {
  ThreadPool pool(4, 1024);
  constexpr int kQueues = 4;
  constexpr int kItems = 500;
  std::vector<std::unique_ptr<SerialQueue>> queues;
  std::vector<std::vector<int>> seen(kQueues);
  std::vector<std::atomic<int>> running(kQueues);
  std::atomic<bool> overlapped{false};
  for (int q = 0; q < kQueues; ++q) queues.push_back(std::make_unique<SerialQueue>(pool));
  for (int i = 0; i < kItems; ++i) {
    for (int q = 0; q < kQueues; ++q) {
      queues[q]->Post([&, q, i] {
        if (running[q].fetch_add(1) != 0) overlapped = true;
        seen[q].push_back(i);  // only this queue's items touch seen[q]
        running[q].fetch_sub(1);
      });
    }
  }
  for (auto& queue : queues) queue->Drain();
  EXPECT_FALSE(overlapped) << "two items of one queue ran at once";
  for (int q = 0; q < kQueues; ++q) {
    ASSERT_EQ(seen[q].size(), static_cast<size_t>(kItems));
    for (int i = 0; i < kItems; ++i) ASSERT_EQ(seen[q][i], i) << "queue " << q;
    EXPECT_TRUE(queues[q]->idle());
  }
}

TEST(SerialQueueTest, AnItemTheExecutorRefusesRunsOnTheCallersThread) {
  FullExecutor full;
  SerialQueue queue(full);
  std::vector<int> ran;
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id where;
  queue.Post([&] {
    ran.push_back(1);
    where = std::this_thread::get_id();
  });
  queue.Post([&] { ran.push_back(2); });
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  EXPECT_EQ(where, caller);
  EXPECT_TRUE(queue.idle());
}

// A queue may be destroyed as soon as it is idle, while the pool thread that ran its last item
// is still returning from it, unlocking the queue's mutex (the coordinator frees a deleted
// task's queues so). A use after free here shows under ThreadSanitizer (scripts/test --tsan,
// whose Abseil is instrumented: the unlock is in Abseil's code).
TEST(SerialQueueTest, AnIdleQueueMayGoWhileItsLastRunReturns) {
  ThreadPool pool(2, 64);
  std::atomic<int> ran{0};
  for (int i = 0; i < 2000; ++i) {
    auto queue = std::make_unique<SerialQueue>(pool);
    queue->Post([&] { ran.fetch_add(1); });
    queue->Drain();
    queue.reset();
  }
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 2000);
}

}  // namespace
}  // namespace shoal
