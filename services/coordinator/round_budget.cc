#include "services/coordinator/round_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/task/task_privacy.h"

namespace shoal::coordinator {

RoundBudget::RoundBudget(std::string task, common::v1::TaskSpec spec, CoordinatorMetrics& metrics)
    : task_(std::move(task)),
      spec_(std::move(spec)),
      metrics_(metrics),
      enabled_(task::HasDp(spec_)) {}

void RoundBudget::Init(v1::TaskStatus& status) const {
  if (enabled_ && !status.has_privacy()) InitPrivacyStatus(spec_, *status.mutable_privacy());
}

RoundBudget::Decision RoundBudget::Check(const v1::TaskStatus& status,
                                         const std::vector<std::string>& peers, size_t population,
                                         uint64_t round) {
  Decision decision;
  if (!enabled_) return decision;
  std::optional<RoundCharge> charge = RoundChargeOf(spec_, status, peers, population);
  if (!charge.has_value()) {
    if (!waiting_logged_) {
      LogInfo("task ", task_, ": round ", round,
              " waits for every peer's data report (privacy.dp level sample: the sampling "
              "rate is batch_size over the smallest shard)");
      waiting_logged_ = true;
    }
    decision.kind = Decision::Kind::kWaitForData;
    return decision;
  }
  waiting_logged_ = false;
  decision.charge = *charge;
  absl::StatusOr<std::optional<std::string>> over =
      BudgetExceededBy(spec_, status.privacy(), round, *charge);
  if (!over.ok()) {
    decision.kind = Decision::Kind::kFailed;
    decision.message = absl::StrCat("privacy accountant: ", over.status().message());
  } else if (over->has_value()) {
    LogInfo("task ", task_, ": ", **over);
    decision.kind = Decision::Kind::kSpent;
    decision.message = **std::move(over);
  }
  return decision;
}

RoundBudget::Decision RoundBudget::CheckAndCharge(v1::TaskStatus& status,
                                                  const std::vector<std::string>& peers,
                                                  size_t population, uint64_t round) {
  Decision decision = Check(status, peers, population, round);
  if (!enabled_ || decision.kind != Decision::Kind::kOpen) return decision;
  if (absl::Status s = Charge(round, decision.charge, status); !s.ok()) {
    decision.kind = Decision::Kind::kFailed;
    decision.message = std::string(s.message());
  }
  return decision;
}

absl::Status RoundBudget::Charge(uint64_t round, RoundCharge charge, v1::TaskStatus& status) {
  if (absl::Status s = ChargeRound(spec_, charge, *status.mutable_privacy()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("privacy accountant: ", s.message()));
  }
  metrics_.privacy_rounds.Increment();
  metrics_.privacy_epsilon.Set(status.privacy().epsilon());
  LogInfo("task ", task_, ": round ", round, " charged to the privacy budget: epsilon ",
          status.privacy().epsilon(), " at delta ", status.privacy().delta(), " after ",
          status.privacy().rounds(), " rounds (", status.privacy().steps(), " steps at q ",
          charge.q, ")");
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
