#include "services/peer_agent/modes/decentralized/average.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::peer {

absl::StatusOr<tensor::FlatModel> AverageUpdates(std::vector<PeerUpdate> updates) {
  if (updates.empty()) return absl::InvalidArgumentError("no updates to average");
  std::sort(updates.begin(), updates.end(),
            [](const PeerUpdate& a, const PeerUpdate& b) { return a.peer_id < b.peer_id; });
  double total = 0;
  for (size_t j = 0; j < updates.size(); ++j) {
    const PeerUpdate& u = updates[j];
    if (j > 0 && u.peer_id == updates[j - 1].peer_id) {
      return absl::InvalidArgumentError(absl::StrCat("two updates from peer ", u.peer_id));
    }
    if (u.model == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update of peer ", u.peer_id, " has no model"));
    }
    if (!(u.model->layout == updates[0].model->layout) ||
        u.model->values.size() != updates[0].model->layout.total_elements()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update of peer ", u.peer_id, " has layout ",
                       u.model->layout.DebugString(), ", the update of peer ", updates[0].peer_id,
                       " has ", updates[0].model->layout.DebugString()));
    }
    total += static_cast<double>(u.num_samples);
  }
  if (total <= 0) return absl::InvalidArgumentError("the updates were trained on 0 samples");
  const size_t n = updates[0].model->values.size();
  std::vector<double> sum(n, 0.0);
  for (const PeerUpdate& u : updates) {  // ascending peer id: the same order everywhere
    const double w = static_cast<double>(u.num_samples);
    const std::vector<float>& x = u.model->values;
    for (size_t i = 0; i < n; ++i) sum[i] += w * static_cast<double>(x[i]);
  }
  tensor::FlatModel out;
  out.layout = updates[0].model->layout;
  out.values.resize(n);
  for (size_t i = 0; i < n; ++i) out.values[i] = static_cast<float>(sum[i] / total);
  return out;
}

}  // namespace shoal::peer
