// centered-clipping (Karimireddy, He and Jaggi 2021, "Learning from History for Byzantine
// Robust Optimization"): starting at v = 0 (the round's base model), L times
//   v <- v + (1/K) sum_i (x_i - v) min(1, tau / |x_i - v|)
// so that no update moves the result by more than tau / K per iteration. Unweighted.

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/stored_updates.h"
#include "libs/aggregation/strategy_registry.h"

namespace shoal::aggregation::internal {
namespace {

using common::v1::AggregationOptions;

constexpr uint32_t kDefaultIterations = 3;
constexpr uint32_t kMaxIterations = 100;

// Owned by the round; not thread-safe (see Aggregation).
class CenteredClippingAggregation final : public StoredUpdates {
 public:
  CenteredClippingAggregation(tensor::ModelLayout layout, size_t expected_updates, int threads,
                              double radius, uint32_t iterations)
      : StoredUpdates(std::move(layout), expected_updates, threads),
        radius_(radius),
        iterations_(iterations) {}

 private:
  AggregationReport CombineSorted(const SortedUpdates& updates, const float* base,
                                  float* out) const override {
    const size_t k = updates.size(), n = updates.n;
    // `out` holds v during the iterations: no model-sized scratch beyond the caller's buffer.
    float* v = out;
    std::fill(v, v + n, 0.0f);
    std::vector<double> scale(k);
    for (uint32_t l = 0; l < iterations_; ++l) {
      const std::vector<double> squared =
          StripedSums(n, threads(), k, [&updates, k, v](size_t begin, size_t end, double* acc) {
            for (size_t u = 0; u < k; ++u) {
              acc[u] += SquaredDistance(updates.deltas[u] + begin, v + begin, end - begin);
            }
          });
      for (size_t u = 0; u < k; ++u) {
        const double norm = std::sqrt(squared[u]);
        scale[u] = norm > radius_ ? radius_ / norm : 1.0;
      }
      const double inv_k = 1.0 / static_cast<double>(k);
      ParallelFor(n, threads(), [&updates, &scale, k, inv_k, v](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
          const double center = v[i];
          double step = 0;
          for (size_t u = 0; u < k; ++u) step += scale[u] * (updates.deltas[u][i] - center);
          v[i] = static_cast<float>(center + step * inv_k);
        }
      });
    }
    ParallelFor(n, threads(), [base, out](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) out[i] = base[i] + out[i];
    });
    return {};
  }

  double radius_;
  uint32_t iterations_;
};

}  // namespace

std::vector<StrategyDefinition> CenteredClippingStrategies() {
  StrategyDefinition def;
  def.kind = common::v1::AGGREGATION_CENTERED_CLIPPING;
  def.params = {"clip_radius", "clip_iterations"};
  def.apply_defaults = [](AggregationOptions& p) {
    if (!p.has_clip_iterations()) p.set_clip_iterations(kDefaultIterations);
  };
  def.validate = [](const AggregationOptions& p) -> absl::Status {
    if (!p.has_clip_radius()) {
      return absl::InvalidArgumentError(
          "clip_radius: required: tau, the L2 norm beyond which an update's pull is clipped");
    }
    if (!(p.clip_radius() > 0) || !std::isfinite(p.clip_radius())) {
      return absl::InvalidArgumentError(
          absl::StrCat("clip_radius: must be > 0, got ", p.clip_radius()));
    }
    if (p.clip_iterations() < 1 || p.clip_iterations() > kMaxIterations) {
      return absl::InvalidArgumentError(absl::StrCat(
          "clip_iterations: must be in 1..", kMaxIterations, ", got ", p.clip_iterations()));
    }
    return absl::OkStatus();
  };
  def.start = [](tensor::ModelLayout layout, size_t expected_updates, int threads,
                 const AggregationOptions& p) -> std::unique_ptr<Aggregation> {
    return std::make_unique<CenteredClippingAggregation>(
        std::move(layout), expected_updates, threads, p.clip_radius(), p.clip_iterations());
  };
  return {def};
}

}  // namespace shoal::aggregation::internal
