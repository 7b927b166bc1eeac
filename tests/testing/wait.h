#pragma once

// Waiting on a condition with a deadline, for tests that observe something they cannot be
// notified of (a metric, a file, a process's output). Never sleep-and-hope: a test waits for
// the state it needs, up to a deadline that is generous enough for a loaded machine, and
// fails with a message when the deadline passes.

#include <algorithm>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal::testing {

// Polls `condition` every `poll` until it holds or `timeout` has passed. Returns whether it
// held; the condition is checked once more at the deadline, so a timeout of zero checks once.
inline bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
                      absl::Duration poll = absl::Milliseconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return condition();
    absl::SleepFor(std::min(poll, deadline - now));
  }
  return true;
}

}  // namespace shoal::testing
