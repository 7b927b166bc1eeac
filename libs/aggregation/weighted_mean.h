#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/tensor/flat_model.h"

namespace shoal::aggregation {

// How a weighted sum of deltas is kept (aggregation_options.exact_sum).
enum class Summation {
  // float32, folded in arrival order: one model's memory and the fastest pass. Float addition
  // is not associative, so two sums of the same updates in another order (or grouped into
  // partial sums another way) agree within float rounding, not to the bit.
  kFloat,
  // Exact: each term w x delta is rounded once, toward zero, to a multiple of 2^-64, and the
  // terms (and the weights, likewise) are summed as 128-bit integers. Integer addition is
  // associative, so every order and every grouping into partial sums gives the same bits: a
  // tree of supernodes publishes the model a flat round would, and peers that aggregate the
  // same updates in different orders agree. 4x the memory of kFloat (16 bytes a value); each
  // term and weight must be under 2^40 in magnitude and a sum may hold at most 2^22 terms.
  kExact,
};

// A 128-bit fixed-point value in units of 2^-64 (kExact).
using ExactValue = __int128;

// A partial aggregate: sum(w_i x delta_i) over some contributors with sum(w_i), never an
// average, so that partial sums add up to the sum over all of them (what a supernode forwards
// to its parent). `sum` holds the values for kFloat, `exact` (and `exact_weight`) for kExact.
struct PartialSum {
  Summation summation = Summation::kFloat;
  std::vector<float> sum = {};
  std::vector<ExactValue> exact = {};
  size_t count = 0;         // contributors summed
  double total_weight = 0;  // sum(w_i); for kExact, exact_weight converted
  ExactValue exact_weight = 0;
};

// Running weighted sum of deltas over one ModelLayout (FedAvg): after Add(delta_i, w_i) for
// every contributor, Apply(base) = base + sum(w_i * delta_i) / sum(w_i). Memory is one model's
// worth of floats (kExact: 4x), however many deltas are added. The first Add writes the sum
// directly (no zero-fill pass). Owned by one round; not thread-safe.
class WeightedMeanAccumulator {
 public:
  // `threads` > 1 splits the passes over large models across that many threads (started and
  // joined inside each call; a 100M-float fold takes ~55 ms on one core, ~30 ms on two).
  explicit WeightedMeanAccumulator(tensor::ModelLayout layout, int threads = 1,
                                   Summation summation = Summation::kFloat);

  // Folds `delta` (layout().total_elements() floats) with `weight` > 0.
  // Errors: INVALID_ARGUMENT, nothing added, on a size mismatch, a non-positive / non-finite
  // weight, and for kExact a term or weight over the bound (named) or a sum of too many terms.
  absl::Status Add(absl::Span<const float> delta, double weight);
  // Add, for a caller that owns `delta`: the first term of a kFloat sum takes `delta`'s buffer
  // as the running sum (scaled in place, no copy), and `delta` gets the sum's previous buffer
  // (empty when it had none) for the caller to reuse. Any other term: Add, `delta` untouched.
  absl::Status AddTaking(std::vector<float>& delta, double weight);
  // Adds another accumulator's Partial() over the same layout and summation, as if its
  // contributors had been added here. Errors: INVALID_ARGUMENT on a size or summation mismatch,
  // a non-finite value or weight, too many terms (kExact); nothing added.
  absl::Status AddPartial(const PartialSum& partial);
  // Differential privacy's term (kFloat only, after at least one Add): adds `noise` (the
  // layout's size, finite; empty: nothing) to the sum and `weight` (>= 0, finite) to the total
  // weight, without counting a contributor. With every update weighted 1 and `weight` = n - k
  // for k updates of n expected, Apply gives base + (sum + noise) / n: a fixed denominator.
  // Errors: INVALID_ARGUMENT, nothing added.
  absl::Status AddNoiseTerm(absl::Span<const float> noise, double weight);
  // The running sum and its weight (a copy), for a parent to AddPartial.
  PartialSum Partial() const;

  // base + mean delta; `base` must have this layout. With no contributions returns `base`.
  absl::StatusOr<tensor::FlatModel> Apply(const tensor::FlatModel& base) const;
  // Same, writing into `out` (its capacity is reused: pass a recycled model buffer to skip the
  // first-touch cost of a fresh allocation).
  absl::Status ApplyInto(const tensor::FlatModel& base, std::vector<float>& out) const;
  // ApplyInto without a second model-sized buffer: a kFloat sum with terms becomes the result in
  // its own buffer, which is swapped with `out`'s (the accumulator keeps `out`'s previous buffer
  // for its next sum, which AddTaking gives back). Otherwise ApplyInto. Either way the
  // accumulator is then as after Reset.
  absl::Status ApplyInPlace(const tensor::FlatModel& base, std::vector<float>& out);
  // The mean delta itself (zeros when nothing was added).
  std::vector<float> MeanDelta() const;

  size_t count() const { return count_; }
  double total_weight() const;
  Summation summation() const { return summation_; }
  const tensor::ModelLayout& layout() const { return layout_; }
  // Forgets every contribution; keeps the buffer for reuse.
  void Reset();

 private:
  // sum / total weight, element i, as the mean delta.
  float MeanAt(size_t i) const;

  tensor::ModelLayout layout_;
  int threads_;
  Summation summation_;
  std::vector<float> sum_;         // kFloat; sized on first Add
  std::vector<ExactValue> exact_;  // kExact; sized on first Add
  size_t count_ = 0;
  double total_weight_ = 0;      // kFloat
  ExactValue exact_weight_ = 0;  // kExact
};

}  // namespace shoal::aggregation
