#include "libs/common/clock.h"

namespace shoal {

Clock& RealClock::Get() {
  static RealClock* clock = new RealClock();
  return *clock;
}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace shoal
