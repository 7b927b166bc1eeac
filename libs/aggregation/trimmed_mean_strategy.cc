// trimmed-mean: per coordinate, drop the floor(trim_ratio x K) lowest and as many highest
// values and average the rest (Yin et al. 2018). Unweighted, like median.

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/stored_updates.h"
#include "libs/aggregation/strategy_registry.h"

namespace shoal::aggregation::internal {
namespace {

constexpr double kDefaultTrimRatio = 0.1;

// Values trimmed at each end of K. The epsilon keeps a product such as 0.29 x 100 =
// 28.999999999999996 from losing one.
size_t TrimCount(double ratio, size_t k) {
  return static_cast<size_t>(std::floor(ratio * static_cast<double>(k) + 1e-9));
}

// Owned by the round; not thread-safe (see Aggregation).
class TrimmedMeanAggregation final : public StoredUpdates {
 public:
  TrimmedMeanAggregation(tensor::ModelLayout layout, size_t expected_updates, int threads,
                         double ratio)
      : StoredUpdates(std::move(layout), expected_updates, threads), ratio_(ratio) {}

 private:
  AggregationReport CombineSorted(const SortedUpdates& updates, const float* base,
                                  float* out) const override {
    const size_t k = updates.size();
    // ratio < 0.5 keeps at least one value: 2 floor(ratio K) < K.
    const size_t t = TrimCount(ratio_, k);
    const double kept = static_cast<double>(k - 2 * t);
    ForEachColumn(updates, threads(), [=](size_t i, absl::Span<float> column) {
      if (t > 0) {
        // Lowest t to the front, then highest t to the back; [t, k - t) is what stays.
        std::nth_element(column.begin(), column.begin() + t, column.end());
        std::nth_element(column.begin() + t, column.begin() + (k - t), column.end());
      }
      double sum = 0;
      for (size_t j = t; j < k - t; ++j) sum += column[j];
      out[i] = base[i] + static_cast<float>(sum / kept);
    });
    AggregationReport report;
    if (t == 0 && ratio_ > 0) {
      report.note = absl::StrCat("trimmed-mean: ", k, " updates at trim_ratio ", ratio_,
                                 " trim none (an unweighted mean)");
    }
    return report;
  }

  double ratio_;
};

}  // namespace

std::vector<StrategyDefinition> TrimmedMeanStrategies() {
  StrategyDefinition def;
  def.kind = common::v1::AGGREGATION_TRIMMED_MEAN;
  def.params = {"trim_ratio"};
  def.apply_defaults = [](common::v1::AggregationOptions& p) {
    if (!p.has_trim_ratio()) p.set_trim_ratio(kDefaultTrimRatio);
  };
  def.validate = [](const common::v1::AggregationOptions& p) -> absl::Status {
    if (!(p.trim_ratio() >= 0 && p.trim_ratio() < 0.5)) {
      return absl::InvalidArgumentError(
          absl::StrCat("trim_ratio: must be in [0, 0.5), got ", p.trim_ratio()));
    }
    return absl::OkStatus();
  };
  def.start = [](tensor::ModelLayout layout, size_t expected_updates, int threads,
                 const common::v1::AggregationOptions& p) -> std::unique_ptr<Aggregation> {
    return std::make_unique<TrimmedMeanAggregation>(std::move(layout), expected_updates, threads,
                                                    p.trim_ratio());
  };
  return {def};
}

}  // namespace shoal::aggregation::internal
