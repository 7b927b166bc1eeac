#pragma once

// shoal-sim's secure aggregation (--secure, --neighbourhood-size, --drop-after-masking): the
// task's privacy.secure_aggregation and the light peers' secure mode, from the flags.

#include <cstdint>

#include "absl/flags/declare.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "tests/bench/light_peer.h"

ABSL_DECLARE_FLAG(bool, secure);  // secure aggregation in the task and the light peers

namespace shoal::bench {

// With --secure: privacy.secure_aggregation (clip norm 1, the default threshold).
void ApplySecureFlags(common::v1::TaskSpec& spec);
// With --secure: Options::secure and Options::drop_after_masking.
void ApplySecureFlags(Fleet::Options& options);
// The peers the coordinator dropped from the task's rounds (their updates not in the sum), less
// the `dropping` ones told to drop out of each round: each is an error.
int64_t UnexpectedDrops(const coordinator::v1::TaskStatus& status, int dropping);

}  // namespace shoal::bench
