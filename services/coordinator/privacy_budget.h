#pragma once

// The differential privacy budget of a task (TaskSpec.privacy.dp): an RDP accountant of the
// sampled Gaussian mechanism (libs/privacy/rdp_accountant.h) kept in the task's status
// (TaskStatus.privacy), so it is persisted with the task and a coordinator restart, an
// aggregator failover or a round that runs again never resets it.
//
// A round is charged when it opens, before any update of it can be published: a coordinator
// that stops between publishing a round and persisting the charge can therefore never
// under-count. A round that then fails is still charged (conservative).
//
// Plain functions over the status; the caller (the task's mode, under the core's lock)
// persists the status after a charge.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

// The sampling rate of a round: its expected peers over the peers of the task's population
// (the peers in the task when it opens). Every peer of a federated-sync task is expected in
// every round, so this is 1 there. The accountant treats it as Poisson sampling at that rate,
// the usual approximation for sampling a fixed number (McMahan et al. 2018).
double RoundSamplingRate(size_t expected_peers, size_t population);

// Fills `privacy` for a task with privacy.dp that has none yet: epsilon 0, the task's delta and
// target, the accountant's orders with zero RDP. Nothing when it is filled already.
void InitPrivacyStatus(const common::v1::TaskSpec& spec, v1::PrivacyStatus& privacy);

// What one round costs: `steps` compositions of the sampled Gaussian mechanism at sampling
// rate `q` with the task's noise_multiplier. Level peer: one step at the round's peer sampling
// rate. Level sample: round_batches DP-SGD steps at batch_size / the smallest shard.
struct RoundCharge {
  double q = 1;
  uint64_t steps = 1;
};

// Level sample: the round's charge from the training samples its peers reported
// (TaskStatus.data). nullopt while some peer of `peers` has not reported yet (the round waits:
// its sampling rate is not known). Level peer: RoundSamplingRate(expected, population), 1 step.
std::optional<RoundCharge> RoundChargeOf(const common::v1::TaskSpec& spec,
                                         const v1::TaskStatus& status,
                                         const std::vector<std::string>& peers, size_t population);

// Whether one more round charged `charge` keeps epsilon within privacy.dp.target_epsilon:
// nullopt when it does (or there is no target), else the message the task completes with,
// naming the budget. Errors: INVALID_ARGUMENT for a corrupt stored state.
absl::StatusOr<std::optional<std::string>> BudgetExceededBy(const common::v1::TaskSpec& spec,
                                                            const v1::PrivacyStatus& privacy,
                                                            uint64_t round, RoundCharge charge);

// Charges one round: adds its RDP, updates epsilon, rounds, steps, the sampling rate and
// rounds_left (how many more rounds of this charge fit). Errors: INVALID_ARGUMENT (nothing
// changed).
absl::Status ChargeRound(const common::v1::TaskSpec& spec, RoundCharge charge,
                         v1::PrivacyStatus& privacy);

}  // namespace shoal::coordinator
