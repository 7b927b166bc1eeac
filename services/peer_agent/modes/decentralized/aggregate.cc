#include "services/peer_agent/modes/decentralized/aggregate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/aggregation/update_validation.h"

namespace shoal::peer {

absl::StatusOr<RoundAggregate> AggregateRound(const aggregation::Strategy& strategy,
                                              const tensor::FlatModel& base,
                                              std::vector<PeerUpdate> updates,
                                              double max_update_norm) {
  if (updates.empty()) return absl::InvalidArgumentError("no updates to aggregate");
  if (base.values.size() != base.layout.total_elements()) {
    return absl::InvalidArgumentError("the round's base model does not match its layout");
  }
  std::sort(updates.begin(), updates.end(),
            [](const PeerUpdate& a, const PeerUpdate& b) { return a.peer_id < b.peer_id; });
  for (size_t j = 0; j < updates.size(); ++j) {
    const PeerUpdate& u = updates[j];
    if (j > 0 && u.peer_id == updates[j - 1].peer_id) {
      return absl::InvalidArgumentError(absl::StrCat("two updates from peer ", u.peer_id));
    }
    if (u.model == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update of peer ", u.peer_id, " has no model"));
    }
    if (!(u.model->layout == base.layout) || u.model->values.size() != base.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the update of peer ", u.peer_id, " has layout ", u.model->layout.DebugString(),
          ", the round's base model has ", base.layout.DebugString()));
    }
  }

  std::unique_ptr<aggregation::Aggregation> round = strategy.Start(base.layout, updates.size());
  RoundAggregate out;
  std::vector<float> delta(base.values.size());
  for (const PeerUpdate& u : updates) {  // ascending peer id: the same order everywhere
    const std::vector<float>& x = u.model->values;
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = x[i] - base.values[i];
    const double norm = aggregation::L2Norm(delta);
    // A non-finite delta is not "too large": Add() names its first bad value below.
    if (max_update_norm > 0 && std::isfinite(norm) && norm > max_update_norm) {
      out.excluded.push_back(ExcludedUpdate{
          u.peer_id,
          absl::StrFormat("delta norm %g exceeds max_update_norm %g", norm, max_update_norm)});
      continue;
    }
    if (u.num_samples == 0) {
      out.excluded.push_back(ExcludedUpdate{u.peer_id, "trained on 0 samples"});
      continue;
    }
    if (absl::Status s = round->Add(delta, static_cast<double>(u.num_samples), u.peer_id);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update of peer ", u.peer_id, ": ", s.message()));
    }
    out.included.push_back(u.peer_id);
    out.num_samples += u.num_samples;
  }
  absl::StatusOr<aggregation::AggregationReport> report = round->ApplyInto(base, out.model.values);
  if (!report.ok()) return report.status();
  out.model.layout = base.layout;
  out.note = std::move(report->note);
  return out;
}

}  // namespace shoal::peer
