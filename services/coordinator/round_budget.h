#pragma once

// How a mode's rounds meet a task's differential privacy budget (TaskSpec.privacy.dp): before a
// round opens, whether it may (its charge known, within the target); when it opens, the charge
// into the task's persisted status (privacy_budget.h), the metrics and the log. Federated-sync
// and decentralized tasks open their rounds through one each.
//
// Not thread-safe: driven under the core's lock, like the ModeTask that owns it.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/privacy_budget.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

class RoundBudget {
 public:
  // What Check says of the next round.
  struct Decision {
    enum class Kind {
      kOpen,         // open it; charge `charge` when it opens
      kWaitForData,  // level sample: some peer has not reported its data yet
      kSpent,        // the round would pass target_epsilon: the task completes with `message`
      kFailed,       // the stored accountant is corrupt: the task fails with `message`
    };
    Kind kind = Kind::kOpen;
    RoundCharge charge;
    std::string message;
  };

  RoundBudget(std::string task, common::v1::TaskSpec spec, CoordinatorMetrics& metrics);

  // Whether the task has a budget (privacy.dp); without one Check always opens.
  bool enabled() const { return enabled_; }
  // Fills status.privacy (epsilon 0) when the task has a budget and the status none yet.
  void Init(v1::TaskStatus& status) const;
  // Before round `round` opens for `peers` out of a population of `population` peers.
  Decision Check(const v1::TaskStatus& status, const std::vector<std::string>& peers,
                 size_t population, uint64_t round);
  // Check, and when the round may open, Charge it at once (kFailed when that fails): for a mode
  // whose rounds open as soon as it decides so.
  Decision CheckAndCharge(v1::TaskStatus& status, const std::vector<std::string>& peers,
                          size_t population, uint64_t round);
  // Round `round` opened: charges it into status.privacy (persisted with the caller's status),
  // sets the metrics and logs. Errors: INVALID_ARGUMENT from the accountant (nothing charged;
  // the task should fail with it).
  absl::Status Charge(uint64_t round, RoundCharge charge, v1::TaskStatus& status);

 private:
  const std::string task_;
  const common::v1::TaskSpec spec_;
  CoordinatorMetrics& metrics_;
  const bool enabled_;
  bool waiting_logged_ = false;  // the wait for data reports is logged once per wait
};

}  // namespace shoal::coordinator
