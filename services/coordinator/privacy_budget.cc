#include "services/coordinator/privacy_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/privacy/rdp_accountant.h"

namespace shoal::coordinator {
namespace {

absl::StatusOr<privacy::RdpAccountant> AccountantOf(const v1::PrivacyStatus& privacy) {
  privacy::RdpAccountantOptions options;
  if (privacy.rdp_orders_size() == 0) return privacy::RdpAccountant::Create(options);
  options.orders.assign(privacy.rdp_orders().begin(), privacy.rdp_orders().end());
  return privacy::RdpAccountant::Restore(
      std::move(options), std::vector<double>(privacy.rdp().begin(), privacy.rdp().end()),
      // Before steps was kept, every charge was one step: rounds counts them.
      static_cast<int64_t>(privacy.steps() > 0 ? privacy.steps() : privacy.rounds()));
}

// JSON has no infinity: an epsilon without any bound shows as the largest double.
double Shown(double epsilon) {
  return std::isfinite(epsilon) ? epsilon : std::numeric_limits<double>::max();
}

}  // namespace

double RoundSamplingRate(size_t expected_peers, size_t population) {
  if (population == 0) return 1;
  return std::min(1.0, static_cast<double>(expected_peers) / static_cast<double>(population));
}

void InitPrivacyStatus(const common::v1::TaskSpec& spec, v1::PrivacyStatus& privacy) {
  if (privacy.rdp_orders_size() > 0) return;
  const common::v1::DpSpec& dp = spec.privacy().dp();
  privacy.set_epsilon(0);
  privacy.set_delta(dp.delta());
  privacy.set_target_epsilon(dp.has_target_epsilon() ? dp.target_epsilon() : 0);
  for (double order : privacy::DefaultRdpOrders()) {
    privacy.add_rdp_orders(order);
    privacy.add_rdp(0);
  }
}

std::optional<RoundCharge> RoundChargeOf(const common::v1::TaskSpec& spec,
                                         const v1::TaskStatus& status,
                                         const std::vector<std::string>& peers, size_t population) {
  if (spec.privacy().dp().level() != common::v1::DP_LEVEL_SAMPLE) {
    return RoundCharge{RoundSamplingRate(peers.size(), population), 1};
  }
  // The peer with the smallest shard samples each of its records most often: its records are
  // the least hidden, and the task's guarantee is the weakest peer's.
  uint64_t smallest = 0;
  for (const std::string& id : peers) {
    auto it = std::find_if(status.data().begin(), status.data().end(),
                           [&id](const v1::PeerData& d) { return d.peer_id() == id; });
    if (it == status.data().end()) return std::nullopt;
    if (smallest == 0 || it->train_samples() < smallest) smallest = it->train_samples();
  }
  RoundCharge charge;
  charge.q =
      smallest == 0
          ? 1
          : std::min(1.0, static_cast<double>(spec.batch_size()) / static_cast<double>(smallest));
  charge.steps = std::max<uint32_t>(spec.round_batches(), 1);
  return charge;
}

absl::StatusOr<std::optional<std::string>> BudgetExceededBy(const common::v1::TaskSpec& spec,
                                                            const v1::PrivacyStatus& privacy,
                                                            uint64_t round, RoundCharge charge) {
  const common::v1::DpSpec& dp = spec.privacy().dp();
  if (!dp.has_target_epsilon()) return std::nullopt;
  absl::StatusOr<privacy::RdpAccountant> accountant = AccountantOf(privacy);
  if (!accountant.ok()) return accountant.status();
  privacy::RdpAccountant next = *accountant;
  if (absl::Status s =
          next.AddSteps(charge.q, dp.noise_multiplier(), static_cast<int64_t>(charge.steps));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<privacy::PrivacySpent> after = next.Spent(dp.delta());
  if (!after.ok()) return after.status();
  if (after->epsilon <= dp.target_epsilon()) return std::nullopt;
  return absl::StrFormat(
      "privacy budget reached: epsilon %.4g spent at delta %g after %d rounds; round %d would "
      "take it to %.4g, over target_epsilon %g",
      privacy.epsilon(), dp.delta(), privacy.rounds(), round, after->epsilon, dp.target_epsilon());
}

absl::Status ChargeRound(const common::v1::TaskSpec& spec, RoundCharge charge,
                         v1::PrivacyStatus& privacy) {
  const common::v1::DpSpec& dp = spec.privacy().dp();
  InitPrivacyStatus(spec, privacy);
  absl::StatusOr<privacy::RdpAccountant> accountant = AccountantOf(privacy);
  if (!accountant.ok()) return accountant.status();
  const auto steps = static_cast<int64_t>(charge.steps);
  if (absl::Status s = accountant->AddSteps(charge.q, dp.noise_multiplier(), steps); !s.ok()) {
    return s;
  }
  absl::StatusOr<privacy::PrivacySpent> spent = accountant->Spent(dp.delta());
  if (!spent.ok()) return spent.status();
  uint64_t rounds_left = 0;
  if (dp.has_target_epsilon()) {
    absl::StatusOr<int64_t> left =
        accountant->StepsLeft(charge.q, dp.noise_multiplier(), dp.target_epsilon(), dp.delta());
    if (!left.ok()) return left.status();
    rounds_left = static_cast<uint64_t>(std::max<int64_t>(*left, 0)) / charge.steps;
  }
  privacy.set_epsilon(Shown(spent->epsilon));
  privacy.set_delta(dp.delta());
  privacy.set_rounds(privacy.rounds() + 1);
  privacy.set_steps(static_cast<uint64_t>(accountant->steps()));
  privacy.set_sampling_rate(charge.q);
  privacy.set_rounds_left(rounds_left);
  privacy.clear_rdp();
  for (double value : accountant->rdp()) privacy.add_rdp(value);
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
