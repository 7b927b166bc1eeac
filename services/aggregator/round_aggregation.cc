#include "services/aggregator/round_aggregation.h"

#include <google/protobuf/util/message_differencer.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::aggregator {

absl::StatusOr<aggregation::Strategy> StrategyFor(const v1::AggregationSettings& settings,
                                                  int threads) {
  aggregation::StrategyOptions options;
  options.kind = settings.strategy() == common::v1::AGGREGATION_UNSPECIFIED
                     ? common::v1::AGGREGATION_MEAN
                     : settings.strategy();
  options.params = settings.options();
  options.threads = threads;
  return aggregation::MakeStrategy(options);
}

RoundAggregation::RoundAggregation(const aggregation::Strategy& strategy,
                                   tensor::ModelLayout layout, size_t expected_updates, int threads)
    : kind_(strategy.kind()), params_(strategy.params()) {
  if (strategy.kind() == common::v1::AGGREGATION_MEAN) {
    mean_.emplace(std::move(layout), threads, aggregation::SummationOf(strategy.params()));
  } else {
    children_.emplace(layout, threads);
    other_ = strategy.Start(std::move(layout), expected_updates);
  }
}

absl::Status RoundAggregation::Add(std::vector<float>& delta, double weight,
                                   absl::string_view contributor) {
  if (mean_.has_value()) return mean_->AddTaking(delta, weight);
  absl::Status added = other_->Add(delta, weight, contributor);
  if (added.ok()) own_weight_ += weight;
  return added;
}

absl::StatusOr<aggregation::WeightedMeanAccumulator> RoundAggregation::ClusterSum(
    const tensor::FlatModel& base) const {
  aggregation::WeightedMeanAccumulator sum = *children_;
  if (other_->count() == 0) return sum;
  std::vector<float> aggregate;
  absl::StatusOr<aggregation::AggregationReport> report = other_->ApplyInto(base, aggregate);
  if (!report.ok()) return report.status();
  // The strategy's result as a delta from the base, weighted by the updates it came from.
  const std::vector<float>& from = base.values;
  for (size_t i = 0; i < aggregate.size(); ++i) aggregate[i] -= from[i];
  if (absl::Status s = sum.Add(aggregate, own_weight_); !s.ok()) return s;
  return sum;
}

bool RoundAggregation::AppliesInPlace() const {
  return mean_.has_value() && mean_->summation() == aggregation::Summation::kFloat &&
         mean_->count() > 0;
}

absl::StatusOr<aggregation::AggregationReport> RoundAggregation::ApplyInto(
    const tensor::FlatModel& base, std::vector<float>& out) {
  if (!mean_.has_value() && children_->count() == 0) return other_->ApplyInto(base, out);
  if (!mean_.has_value()) {
    // A tree round of another strategy: its clusters' results, weighted by their samples.
    absl::StatusOr<aggregation::WeightedMeanAccumulator> sum = ClusterSum(base);
    if (!sum.ok()) return sum.status();
    if (absl::Status s = sum->ApplyInto(base, out); !s.ok()) return s;
    aggregation::AggregationReport report;
    report.updates = count();
    report.note = absl::StrCat(aggregation::StrategyName(kind_), " within each of ", sum->count(),
                               " clusters, their results weighted by samples");
    return report;
  }
  aggregation::AggregationReport report;
  report.updates = mean_->count();
  absl::Status applied = mean_->ApplyInPlace(base, out);
  if (!applied.ok()) return applied;
  if (report.updates == 0) report.note = "no updates: the result is the base model";
  return report;
}

absl::StatusOr<aggregation::PartialSum> RoundAggregation::Partial(
    const tensor::FlatModel& base) const {
  if (mean_.has_value()) return mean_->Partial();
  absl::StatusOr<aggregation::WeightedMeanAccumulator> sum = ClusterSum(base);
  if (!sum.ok()) return sum.status();
  aggregation::PartialSum partial = sum->Partial();
  partial.count = count();  // the peers behind it, not its terms
  return partial;
}

absl::Status RoundAggregation::AddPartial(const aggregation::PartialSum& partial) {
  if (mean_.has_value()) return mean_->AddPartial(partial);
  if (partial.summation != aggregation::Summation::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat("an exact partial sum for a round of ",
                                                   aggregation::StrategyName(kind_),
                                                   " (exact_sum is for mean)"));
  }
  // A child none of whose peers pushed sends an empty sum: nothing to add.
  if (partial.count == 0) return absl::OkStatus();
  // Counted as the peers behind it (count()), added as the sum it is.
  aggregation::PartialSum one = partial;
  one.count = 1;
  absl::Status added = children_->AddPartial(one);
  if (added.ok()) children_peers_ += partial.count;
  return added;
}

absl::Status RoundAggregation::AddNoiseTerm(absl::Span<const float> noise, double weight) {
  if (!mean_.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("differential privacy needs mean, not ", aggregation::StrategyName(kind_)));
  }
  return mean_->AddNoiseTerm(noise, weight);
}

void RoundAggregation::Reset() {
  if (mean_.has_value()) {
    mean_->Reset();
  } else {
    other_->Reset();
    children_->Reset();
    own_weight_ = 0;
    children_peers_ = 0;
  }
}

bool RoundAggregation::Fits(const aggregation::Strategy& strategy,
                            const tensor::ModelLayout& layout) const {
  const tensor::ModelLayout& mine = mean_.has_value() ? mean_->layout() : other_->layout();
  return strategy.kind() == kind_ && mine == layout &&
         google::protobuf::util::MessageDifferencer::Equals(strategy.params(), params_);
}

size_t RoundAggregation::count() const {
  return mean_.has_value() ? mean_->count() : other_->count() + children_peers_;
}

}  // namespace shoal::aggregator
