#pragma once

// A clock that moves only when told to, for unit tests and fuzz targets of code that takes a
// shoal::Clock (libs/common/clock.h).

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"

namespace shoal::testing {

// Thread-safe. Advance() wakes nobody by itself: a waiter on an rpc::Wakeup needs its Notify().
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::testing
