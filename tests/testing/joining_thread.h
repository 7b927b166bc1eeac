#pragma once

// Threads for tests that are joined on every path out of the test.
//
// A test that starts a std::thread and then uses ASSERT_* returns early when the assertion
// fails; a plain std::thread that is still joinable then calls std::terminate, and a thread
// that was detached (or joined too late) goes on writing into the test's destroyed locals.
// JoiningThread joins in its destructor, after asking the body to stop through an optional
// `stop` callback, so declare it after everything its body touches.

#include <functional>
#include <thread>
#include <utility>

namespace shoal::testing {

// Owned by the test that declares it; not thread-safe (one owner calls Join()).
class JoiningThread {
 public:
  // Starts `body` on a new thread. `stop`, when given, runs on the owner's thread before the
  // destructor joins: it must make `body` return soon (cancel a wait, stop a process, ...).
  explicit JoiningThread(std::function<void()> body, std::function<void()> stop = nullptr)
      : stop_(std::move(stop)), thread_(std::move(body)) {}

  ~JoiningThread() {
    if (thread_.joinable() && stop_) stop_();
    Join();
  }

  JoiningThread(const JoiningThread&) = delete;
  JoiningThread& operator=(const JoiningThread&) = delete;

  // Waits for the body to return. Idempotent.
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::function<void()> stop_;
  std::thread thread_;
};

}  // namespace shoal::testing
