#include "services/coordinator/modes/gossip/gossip_privacy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "libs/common/log.h"
#include "libs/privacy/rdp_accountant.h"
#include "libs/task/task_privacy.h"

namespace shoal::coordinator {

GossipPrivacy::GossipPrivacy(common::v1::TaskSpec spec, CoordinatorMetrics& metrics)
    : spec_(std::move(spec)), metrics_(metrics), enabled_(task::HasSampleDp(spec_)) {}

const GossipPrivacy::Spent& GossipPrivacy::SpentBy(const std::string& peer, double q,
                                                   uint64_t steps) {
  Spent& s = spent_[peer];
  if (s.q == q && s.steps == steps && !s.orders.empty()) return s;
  s = Spent{q, steps, 0, {}, {}};
  absl::StatusOr<privacy::RdpAccountant> accountant = privacy::RdpAccountant::Create();
  absl::Status added = accountant.status();
  if (added.ok()) {
    added = accountant->AddSteps(q, spec_.privacy().dp().noise_multiplier(),
                                 static_cast<int64_t>(steps));
  }
  absl::StatusOr<privacy::PrivacySpent> spent =
      added.ok() ? accountant->Spent(spec_.privacy().dp().delta())
                 : absl::StatusOr<privacy::PrivacySpent>(added);
  if (!spent.ok()) {
    // Validated specs never get here; show no bound rather than none spent.
    LogWarning("task ", spec_.name(), ": privacy accountant: ", spent.status().message());
    s.epsilon = std::numeric_limits<double>::infinity();
  } else {
    s.epsilon = spent->epsilon;
    s.orders = accountant->orders();
    s.rdp = accountant->rdp();
  }
  return s;
}

void GossipPrivacy::Update(const std::map<std::string, uint64_t>& steps, uint64_t rounds,
                           v1::TaskStatus& status) {
  if (!enabled_) return;
  const common::v1::DpSpec& dp = spec_.privacy().dp();
  v1::PrivacyStatus& privacy = *status.mutable_privacy();
  for (const auto& [peer, n] : steps) {
    auto data = std::find_if(status.data().begin(), status.data().end(),
                             [&peer = peer](const v1::PeerData& d) { return d.peer_id() == peer; });
    if (data == status.data().end()) continue;  // its sampling rate is not known yet
    const double q = data->train_samples() == 0
                         ? 1
                         : std::min(1.0, static_cast<double>(spec_.batch_size()) /
                                             static_cast<double>(data->train_samples()));
    auto known = spent_.find(peer);
    SpentBy(peer, q, known == spent_.end() ? n : std::max(known->second.steps, n));
  }
  // Peers that left still count: their records stay as exposed as their steps made them.
  const Spent* worst = nullptr;
  for (const auto& [peer, s] : spent_) {
    if (worst == nullptr || s.epsilon > worst->epsilon) worst = &s;
  }
  privacy.set_delta(dp.delta());
  privacy.set_target_epsilon(0);
  privacy.set_rounds_left(0);
  privacy.set_rounds(rounds);
  // JSON has no infinity: an epsilon without any bound shows as the largest double.
  const double epsilon = worst == nullptr ? 0 : worst->epsilon;
  privacy.set_epsilon(std::isfinite(epsilon) ? epsilon : std::numeric_limits<double>::max());
  privacy.set_steps(worst == nullptr ? 0 : worst->steps);
  privacy.set_sampling_rate(worst == nullptr ? 0 : worst->q);
  privacy.clear_rdp_orders();
  privacy.clear_rdp();
  if (worst != nullptr) {
    for (double o : worst->orders) privacy.add_rdp_orders(o);
    for (double r : worst->rdp) privacy.add_rdp(r);
  }
  metrics_.privacy_epsilon.Set(privacy.epsilon());
}

}  // namespace shoal::coordinator
