// mean: the sample-weighted mean of the deltas (FedAvg), folded in as updates arrive.

#include "libs/aggregation/strategy_registry.h"
#include "libs/aggregation/weighted_mean.h"

namespace shoal::aggregation::internal {
namespace {

// WeightedMeanAccumulator behind the Aggregation interface, so results are bit-identical to it
// for the same sequence of Adds. Memory: one model, whatever K.
class MeanAggregation final : public Aggregation {
 public:
  MeanAggregation(tensor::ModelLayout layout, int threads, Summation summation)
      : Aggregation(layout, threads), sum_(std::move(layout), threads, summation) {}

 private:
  absl::Status Fold(absl::Span<const float> delta, double weight,
                    absl::string_view /*contributor*/) override {
    return sum_.Add(delta, weight);
  }
  absl::StatusOr<AggregationReport> Combine(const tensor::FlatModel& base,
                                            std::vector<float>& out) const override {
    absl::Status applied = sum_.ApplyInto(base, out);
    if (!applied.ok()) return applied;
    AggregationReport report;
    report.updates = sum_.count();
    return report;
  }
  void Clear() override { sum_.Reset(); }

  WeightedMeanAccumulator sum_;
};

}  // namespace

std::vector<StrategyDefinition> MeanStrategies() {
  StrategyDefinition mean;
  mean.kind = common::v1::AGGREGATION_MEAN;
  mean.streaming = true;
  mean.params = {"exact_sum"};
  mean.start = [](tensor::ModelLayout layout, size_t /*expected_updates*/, int threads,
                  const common::v1::AggregationOptions& params) -> std::unique_ptr<Aggregation> {
    return std::make_unique<MeanAggregation>(std::move(layout), threads, SummationOf(params));
  };
  return {mean};
}

}  // namespace shoal::aggregation::internal
