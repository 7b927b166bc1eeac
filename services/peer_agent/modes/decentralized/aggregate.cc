#include "services/peer_agent/modes/decentralized/aggregate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/aggregation/update_validation.h"
#include "libs/common/status_macros.h"

namespace shoal::peer {

namespace {

// `participants` in ascending order. Errors: none, or a duplicate id.
absl::Status SortParticipants(std::vector<std::string>& participants) {
  if (participants.empty()) return absl::InvalidArgumentError("no updates to aggregate");
  std::sort(participants.begin(), participants.end());
  for (size_t j = 1; j < participants.size(); ++j) {
    if (participants[j] == participants[j - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("two updates from peer ", participants[j]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RoundFold> RoundFold::Start(const aggregation::Strategy& strategy,
                                           const tensor::ModelLayout& layout,
                                           std::vector<std::string> participants,
                                           double max_update_norm, WaitingOptions waiting) {
  SHOAL_RETURN_IF_ERROR(SortParticipants(participants));
  const size_t n = participants.size();
  return RoundFold(strategy.Start(layout, n), std::move(participants), max_update_norm,
                   strategy.order_independent(), std::move(waiting));
}

absl::Status RoundFold::Restart(std::vector<std::string> participants) {
  SHOAL_RETURN_IF_ERROR(SortParticipants(participants));
  aggregation_->Reset();
  ids_ = std::move(participants);
  next_ = 0;
  folded_.clear();
  waiting_.Clear();
  out_ = RoundAggregate{};
  return absl::OkStatus();
}

RoundFold::RoundFold(std::unique_ptr<aggregation::Aggregation> aggregation,
                     std::vector<std::string> ids, double max_update_norm, bool any_order,
                     WaitingOptions waiting)
    : aggregation_(std::move(aggregation)),
      ids_(std::move(ids)),
      max_update_norm_(max_update_norm),
      any_order_(any_order),
      waiting_(std::move(waiting)) {}

bool RoundFold::Has(const std::string& peer_id) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), peer_id);
  if (it == ids_.end() || *it != peer_id) return false;
  if (any_order_) return folded_.contains(peer_id);
  return static_cast<size_t>(it - ids_.begin()) < next_ || waiting_.contains(peer_id);
}

absl::Status RoundFold::Offer(PeerUpdate update, const tensor::FlatModel& base) {
  const tensor::ModelLayout& layout = aggregation_->layout();
  if (!(base.layout == layout) || base.values.size() != layout.total_elements()) {
    return absl::InvalidArgumentError("the round's base model does not match its layout");
  }
  auto it = std::lower_bound(ids_.begin(), ids_.end(), update.peer_id);
  if (it == ids_.end() || *it != update.peer_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("an update from peer ", update.peer_id, ", not a participant of the round"));
  }
  if (Has(update.peer_id)) {
    return absl::InvalidArgumentError(absl::StrCat("two updates from peer ", update.peer_id));
  }
  if (update.model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update of peer ", update.peer_id, " has no model"));
  }
  if (!(update.model->layout == layout) || update.model->values.size() != base.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the update of peer ", update.peer_id, " has layout ", update.model->layout.DebugString(),
        ", the round's base model has ", layout.DebugString()));
  }
  if (any_order_) {
    SHOAL_RETURN_IF_ERROR(Fold(update, base));
    folded_.insert(update.peer_id);
    return absl::OkStatus();
  }
  if (static_cast<size_t>(it - ids_.begin()) != next_) return waiting_.Put(std::move(update));
  SHOAL_RETURN_IF_ERROR(Fold(update, base));
  update.model.reset();  // its storage can take the next read back
  ++next_;
  // Then whatever waited for this one.
  while (next_ < ids_.size()) {
    SHOAL_ASSIGN_OR_RETURN(std::optional<PeerUpdate> waited, waiting_.Take(ids_[next_]));
    if (!waited) break;
    SHOAL_RETURN_IF_ERROR(Fold(*waited, base));
    ++next_;
  }
  return absl::OkStatus();
}

absl::Status RoundFold::Fold(const PeerUpdate& u, const tensor::FlatModel& base) {
  const std::vector<float>& x = u.model->values;
  double norm = 0;
  if (u.delta) {
    norm = aggregation::L2Norm(x);
  } else {
    delta_.resize(x.size());
    norm = aggregation::DifferenceL2Norm(x, base.values, absl::MakeSpan(delta_));
  }
  const std::vector<float>& delta = u.delta ? x : delta_;
  // A non-finite delta is not "too large": Add() names its first bad value below.
  if (max_update_norm_ > 0 && std::isfinite(norm) && norm > max_update_norm_) {
    out_.excluded.push_back(ExcludedUpdate{
        u.peer_id,
        absl::StrFormat("delta norm %g exceeds max_update_norm %g", norm, max_update_norm_)});
    return absl::OkStatus();
  }
  if (u.num_samples == 0) {
    out_.excluded.push_back(ExcludedUpdate{u.peer_id, "trained on 0 samples"});
    return absl::OkStatus();
  }
  // A finite norm (a sum of squares in double, which no float overflows) has every value finite.
  if (absl::Status s = aggregation_->Add(delta, static_cast<double>(u.num_samples), u.peer_id,
                                         /*finite=*/std::isfinite(norm));
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update of peer ", u.peer_id, ": ", s.message()));
  }
  out_.included.push_back(u.peer_id);
  out_.num_samples += u.num_samples;
  return absl::OkStatus();
}

absl::StatusOr<RoundAggregate> RoundFold::Finish(const tensor::FlatModel& base,
                                                 std::vector<float> buffer) {
  if (!complete()) {
    auto lacking =
        std::find_if(ids_.begin(), ids_.end(), [&](const std::string& id) { return !Has(id); });
    return absl::FailedPreconditionError(
        absl::StrCat("the round's aggregate still lacks the update of peer ", *lacking));
  }
  RoundAggregate out = out_;
  if (any_order_) {  // folded as they came: listed in ascending id order, as in order
    std::sort(out.included.begin(), out.included.end());
    std::sort(
        out.excluded.begin(), out.excluded.end(),
        [](const ExcludedUpdate& a, const ExcludedUpdate& b) { return a.peer_id < b.peer_id; });
  }
  out.model.values = std::move(buffer);
  absl::StatusOr<aggregation::AggregationReport> report =
      aggregation_->ApplyInto(base, out.model.values);
  if (!report.ok()) return report.status();
  out.model.layout = base.layout;
  out.note = std::move(report->note);
  return out;
}

absl::StatusOr<RoundAggregate> AggregateRound(const aggregation::Strategy& strategy,
                                              const tensor::FlatModel& base,
                                              std::vector<PeerUpdate> updates,
                                              double max_update_norm) {
  if (base.values.size() != base.layout.total_elements()) {
    return absl::InvalidArgumentError("the round's base model does not match its layout");
  }
  std::vector<std::string> ids;
  for (const PeerUpdate& u : updates) ids.push_back(u.peer_id);
  SHOAL_ASSIGN_OR_RETURN(RoundFold fold,
                         RoundFold::Start(strategy, base.layout, std::move(ids), max_update_norm));
  for (PeerUpdate& u : updates) SHOAL_RETURN_IF_ERROR(fold.Offer(std::move(u), base));
  return fold.Finish(base);
}

}  // namespace shoal::peer
