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
    other_ = strategy.Start(std::move(layout), expected_updates);
  }
}

absl::Status RoundAggregation::Add(absl::Span<const float> delta, double weight,
                                   absl::string_view contributor) {
  if (mean_.has_value()) return mean_->Add(delta, weight);
  return other_->Add(delta, weight, contributor);
}

absl::StatusOr<aggregation::AggregationReport> RoundAggregation::ApplyInto(
    const tensor::FlatModel& base, std::vector<float>& out) const {
  if (!mean_.has_value()) return other_->ApplyInto(base, out);
  absl::Status applied = mean_->ApplyInto(base, out);
  if (!applied.ok()) return applied;
  aggregation::AggregationReport report;
  report.updates = mean_->count();
  if (report.updates == 0) report.note = "no updates: the result is the base model";
  return report;
}

absl::StatusOr<aggregation::PartialSum> RoundAggregation::Partial() const {
  if (!mean_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("only mean forwards partial sums, not ", aggregation::StrategyName(kind_)));
  }
  return mean_->Partial();
}

absl::Status RoundAggregation::AddPartial(const aggregation::PartialSum& partial) {
  if (!mean_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("only mean takes partial sums, not ", aggregation::StrategyName(kind_)));
  }
  return mean_->AddPartial(partial);
}

void RoundAggregation::Reset() {
  if (mean_.has_value()) {
    mean_->Reset();
  } else {
    other_->Reset();
  }
}

bool RoundAggregation::Fits(const aggregation::Strategy& strategy,
                            const tensor::ModelLayout& layout) const {
  const tensor::ModelLayout& mine = mean_.has_value() ? mean_->layout() : other_->layout();
  return strategy.kind() == kind_ && mine == layout &&
         google::protobuf::util::MessageDifferencer::Equals(strategy.params(), params_);
}

size_t RoundAggregation::count() const {
  return mean_.has_value() ? mean_->count() : other_->count();
}

}  // namespace shoal::aggregator
