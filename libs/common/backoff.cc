#include "libs/common/backoff.h"

#include <algorithm>

namespace shoal {

Backoff::Backoff(BackoffOptions options) : options_(options), current_(options.initial) {}

absl::Duration Backoff::Next() {
  const double factor = absl::Uniform(gen_, 1.0 - options_.jitter, 1.0 + options_.jitter);
  const absl::Duration delay = current_ * factor;
  current_ = std::min(options_.max, current_ * options_.multiplier);
  return delay;
}

void Backoff::Reset() { current_ = options_.initial; }

}  // namespace shoal
