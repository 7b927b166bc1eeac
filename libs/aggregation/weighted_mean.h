#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/tensor/flat_model.h"

namespace shoal::aggregation {

// Running weighted sum of deltas over one ModelLayout (FedAvg): after Add(delta_i, w_i) for
// every contributor, Apply(base) = base + sum(w_i * delta_i) / sum(w_i). Memory is one model's
// worth of floats, however many deltas are added. The first Add writes the sum directly (no
// zero-fill pass). Owned by one round; not thread-safe.
class WeightedMeanAccumulator {
 public:
  // `threads` > 1 splits the passes over large models across that many threads (started and
  // joined inside each call; a 100M-float fold takes ~55 ms on one core, ~30 ms on two).
  explicit WeightedMeanAccumulator(tensor::ModelLayout layout, int threads = 1);

  // Folds `delta` (layout().total_elements() floats) with `weight` > 0.
  // Errors: INVALID_ARGUMENT on a size mismatch or a non-positive / non-finite weight.
  absl::Status Add(absl::Span<const float> delta, double weight);

  // base + mean delta; `base` must have this layout. With no contributions returns `base`.
  absl::StatusOr<tensor::FlatModel> Apply(const tensor::FlatModel& base) const;
  // Same, writing into `out` (its capacity is reused: pass a recycled model buffer to skip the
  // first-touch cost of a fresh allocation).
  absl::Status ApplyInto(const tensor::FlatModel& base, std::vector<float>& out) const;
  // The mean delta itself (zeros when nothing was added).
  std::vector<float> MeanDelta() const;

  size_t count() const { return count_; }
  double total_weight() const { return total_weight_; }
  const tensor::ModelLayout& layout() const { return layout_; }
  // Forgets every contribution; keeps the buffer for reuse.
  void Reset();

 private:
  tensor::ModelLayout layout_;
  int threads_;
  std::vector<float> sum_;  // sized on first Add
  size_t count_ = 0;
  double total_weight_ = 0;
};

}  // namespace shoal::aggregation
