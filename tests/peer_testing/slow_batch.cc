#include "tests/peer_testing/slow_batch.h"

#include "absl/strings/str_cat.h"
#include "libs/rpc/retry.h"

namespace shoal::testing {

absl::StatusOr<peer::AfterBatchHook> SlowBatchHook(absl::Duration delay) {
  if (delay < absl::ZeroDuration() || delay > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--test-slow-batch: must be in [0, 3600000] milliseconds, got ",
                     absl::ToInt64Milliseconds(delay)));
  }
  if (delay == absl::ZeroDuration()) return peer::AfterBatchHook();
  return peer::AfterBatchHook(
      [delay](const rpc::Wakeup& wakeup, const std::function<bool()>& keep_going) {
        wakeup.SleepFor(delay, keep_going);
      });
}

}  // namespace shoal::testing
