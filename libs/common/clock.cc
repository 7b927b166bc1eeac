#include "libs/common/clock.h"

namespace shoal {

Clock& RealClock::Get() {
  static RealClock* clock = new RealClock();
  return *clock;
}

}  // namespace shoal
