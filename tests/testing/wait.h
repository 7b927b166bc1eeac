#pragma once

// Waiting on a condition with a deadline, for tests that observe something they cannot be
// notified of (a metric, a file, a process's output). Never sleep-and-hope: a test waits for
// the state it needs, up to a deadline that is generous enough for a loaded machine, and
// fails with a message when the deadline passes.

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal::testing {

// How much slower than a plain build this one runs: a sanitized build's tests get
// SHOAL_TEST_TIME_SCALE in their environment (cmake/ShoalHelpers.cmake: the factor their ctest
// timeouts are multiplied by), and the deadlines they wait on are scaled by it. 1 when unset.
inline int TimeScale() {
  static const int scale = [] {
    const char* text = std::getenv("SHOAL_TEST_TIME_SCALE");
    const int value = text == nullptr ? 1 : std::atoi(text);
    return std::clamp(value, 1, 100);
  }();
  return scale;
}

// `d` scaled by TimeScale(): a deadline generous enough for a plain build, made as generous for
// a sanitized one.
inline absl::Duration Scaled(absl::Duration d) { return d * TimeScale(); }

// Polls `condition` every `poll` until it holds or Scaled(`timeout`) has passed. Returns whether
// it held; the condition is checked once more at the deadline, so a timeout of zero checks once.
inline bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
                      absl::Duration poll = absl::Milliseconds(10)) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (!condition()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return condition();
    absl::SleepFor(std::min(poll, deadline - now));
  }
  return true;
}

}  // namespace shoal::testing
