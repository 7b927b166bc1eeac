#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal {

// Source of time for everything that schedules: real in production, driven by hand in tests.
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

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override;
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal
