#pragma once

#include <cstdint>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace shoal {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(5);
  double multiplier = 2.0;
  double jitter = 0.2;  // each delay is scaled by a uniform factor in [1 - jitter, 1 + jitter]
};

// Capped exponential backoff with jitter. Not thread-safe; one per retry loop.
class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {});
  // The delay before the next attempt; grows until it reaches the cap.
  absl::Duration Next();
  void Reset();

 private:
  BackoffOptions options_;
  absl::Duration current_;
  absl::BitGen gen_;
};

}  // namespace shoal
