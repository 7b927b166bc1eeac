#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/aggregation/strategy.h"
#include "libs/aggregation/weighted_mean.h"
#include "libs/tensor/flat_model.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// The strategy that `settings` (OpenRound/OpenBuffer) name: unspecified is mean. `threads` split
// the passes over the model. INVALID_ARGUMENT as MakeStrategy ("aggregation_options.trim_ratio:
// ...").
absl::StatusOr<aggregation::Strategy> StrategyFor(const v1::AggregationSettings& settings,
                                                  int threads);

// What a round (or a federated-async buffer pass) folds its accepted updates into: the
// strategy's Aggregation (libs/aggregation/strategy.h), except for mean, whose updates go
// straight into the WeightedMeanAccumulator that the mean strategy wraps (bit-identical
// results). The aggregator's decoder has already checked every value of an update finite, and
// Aggregation::Add checks again: a second pass over each update that made a mean fold 2.6x
// slower (measured: 20 ms -> 53 ms per 50M floats on 2 threads). Owned by its round or buffer;
// not thread-safe (one caller at a time).
class RoundAggregation {
 public:
  // A round of `strategy` over `layout` expecting about `expected_updates` updates.
  RoundAggregation(const aggregation::Strategy& strategy, tensor::ModelLayout layout,
                   size_t expected_updates, int threads);

  // Adds an update whose layout and finiteness the caller has checked; `weight` > 0 (only mean
  // uses it); one update per contributor. Errors (INVALID_ARGUMENT) mean a broken invariant.
  // Mean's first update becomes its running sum (WeightedMeanAccumulator::AddTaking): `delta`
  // then comes back holding the sum's previous buffer, or none.
  absl::Status Add(std::vector<float>& delta, double weight, absl::string_view contributor);
  // True when ApplyInto will make the result in the running sum's own buffer (float mean with
  // updates): the caller need not bring a buffer for it.
  bool AppliesInPlace() const;
  // base + aggregate into `out` (its capacity is reused), with the strategy's report. Mean:
  // WeightedMeanAccumulator::ApplyInPlace (`out` swapped with the sum's buffer), and the
  // updates are spent (as after Reset).
  absl::StatusOr<aggregation::AggregationReport> ApplyInto(const tensor::FlatModel& base,
                                                           std::vector<float>& out);
  // Tree rounds: what the round sends its parent, and a child's partial sum added in
  // (INVALID_ARGUMENT as WeightedMeanAccumulator::AddPartial, nothing added). Mean: the running
  // sum of every update and partial. Another strategy runs per cluster: its aggregate of the
  // round's own updates counts as one term, weighted by their total weight, beside the
  // children's partial sums (a weighted mean across clusters, docs/explanation/aggregation.md);
  // `base` is the round's base model. `count` of the result is the contributors (peers)
  // summed, whatever the strategy kept.
  absl::StatusOr<aggregation::PartialSum> Partial(const tensor::FlatModel& base) const;
  absl::Status AddPartial(const aggregation::PartialSum& partial);
  // Mean only: WeightedMeanAccumulator::AddNoiseTerm (differential privacy's noise and fixed
  // denominator). INVALID_ARGUMENT for another strategy.
  absl::Status AddNoiseTerm(absl::Span<const float> noise, double weight);
  // Forgets the updates, keeping the buffers for the next round.
  void Reset();
  // True when, after Reset(), this can serve a round of `strategy` over `layout`.
  bool Fits(const aggregation::Strategy& strategy, const tensor::ModelLayout& layout) const;
  size_t count() const;
  bool streaming() const { return mean_.has_value(); }

 private:
  common::v1::Aggregation kind_;
  common::v1::AggregationOptions params_;
  std::optional<aggregation::WeightedMeanAccumulator> mean_;  // mean
  std::unique_ptr<aggregation::Aggregation> other_;           // every other strategy
  // Every other strategy, in tree rounds: the children's partial sums (float), and the total
  // weight of the round's own updates.
  std::optional<aggregation::WeightedMeanAccumulator> children_;
  double own_weight_ = 0;
  size_t children_peers_ = 0;  // the peers behind the children's sums

  // Another strategy's partial sum: its aggregate of the own updates as one term (if any), and
  // the children's sums.
  absl::StatusOr<aggregation::WeightedMeanAccumulator> ClusterSum(
      const tensor::FlatModel& base) const;
};

}  // namespace shoal::aggregator
