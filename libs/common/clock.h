#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal {

// Source of time for everything that schedules: real in production, driven by hand in tests
// (tests/testing/fake_clock.h).
// Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock. Thread-safe; a process-wide instance is returned by RealClock::Get().
class RealClock final : public Clock {
 public:
  static Clock& Get();
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace shoal
