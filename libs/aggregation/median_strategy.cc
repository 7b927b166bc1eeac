// median: the coordinate-wise median of the deltas (Yin et al. 2018). Unweighted: a Byzantine
// peer could claim any sample count, and a weighted median would let it buy the result.

#include "libs/aggregation/stored_updates.h"
#include "libs/aggregation/strategy_registry.h"

namespace shoal::aggregation::internal {
namespace {

// Owned by the round; not thread-safe (see Aggregation).
class MedianAggregation final : public StoredUpdates {
 public:
  MedianAggregation(tensor::ModelLayout layout, size_t expected_updates, int threads)
      : StoredUpdates(std::move(layout), expected_updates, threads) {}

 private:
  AggregationReport CombineSorted(const SortedUpdates& updates, const float* base,
                                  float* out) const override {
    CoordinateMedianInto(updates, threads(), base, out);
    return {};
  }
};

}  // namespace

std::vector<StrategyDefinition> MedianStrategies() {
  StrategyDefinition median;
  median.kind = common::v1::AGGREGATION_MEDIAN;
  median.start =
      [](tensor::ModelLayout layout, size_t expected_updates, int threads,
         const common::v1::AggregationOptions& /*params*/) -> std::unique_ptr<Aggregation> {
    return std::make_unique<MedianAggregation>(std::move(layout), expected_updates, threads);
  };
  return {median};
}

}  // namespace shoal::aggregation::internal
