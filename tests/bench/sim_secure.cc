#include "tests/bench/sim_secure.h"

#include <algorithm>

#include "absl/flags/flag.h"

ABSL_FLAG(bool, secure, false,
          "the task has privacy.secure_aggregation (clip norm 1): each peer sends an identity key "
          "in its Hello and answers a round with SecureAggregate (SecAgg+) instead of PushUpdate");
ABSL_FLAG(uint32_t, neighbourhood_size, 0,
          "with --secure: the task's privacy.secure_aggregation.neighbourhood_size, the "
          "neighbours each peer masks with (0: every other peer)");
ABSL_FLAG(double, drop_after_masking, 0,
          "with --secure: this fraction of the peers (rounded) drops out of every round once its "
          "masked update is sent (the stream cancelled at the consistency check)");

namespace shoal::bench {

void ApplySecureFlags(common::v1::TaskSpec& spec) {
  if (!absl::GetFlag(FLAGS_secure)) return;
  common::v1::SecureAggregationSpec& secure = *spec.mutable_privacy()->mutable_secure_aggregation();
  secure.set_clip_norm(1.0);
  secure.set_neighbourhood_size(absl::GetFlag(FLAGS_neighbourhood_size));
}

void ApplySecureFlags(Fleet::Options& options) {
  if (!absl::GetFlag(FLAGS_secure)) return;
  options.secure = true;
  options.drop_after_masking = absl::GetFlag(FLAGS_drop_after_masking);
}

int64_t UnexpectedDrops(const coordinator::v1::TaskStatus& status, int dropping) {
  int64_t unexpected = 0;
  for (const auto& r : status.history()) {
    unexpected += std::max<int64_t>(0, int64_t{r.dropped_count()} - dropping);
  }
  return unexpected;
}

}  // namespace shoal::bench
