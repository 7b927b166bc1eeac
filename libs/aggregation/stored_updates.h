#pragma once

// The shared machinery of the non-streaming strategies: keeping a round's updates, presenting
// them in contributor-id order, and cache-friendly passes over them. Internal to
// libs/aggregation.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "libs/aggregation/strategy.h"
#include "libs/common/parallel_for.h"

namespace shoal::aggregation::internal {

using common::kMinFloatsPerThread;
using common::ParallelFor;

// A round's updates in contributor-id order (the order every non-streaming strategy computes
// in, which makes its result independent of the order of the Adds).
struct SortedUpdates {
  std::vector<const float*> deltas;             // each `n` floats
  std::vector<absl::string_view> contributors;  // same order
  size_t n = 0;                                 // floats per delta
  size_t size() const { return deltas.size(); }
};

// An Aggregation that keeps a copy of every update (K x the model) and computes the result in
// ApplyInto. Subclasses implement CombineSorted. Ownership and thread-safety as Aggregation.
class StoredUpdates : public Aggregation {
 protected:
  StoredUpdates(tensor::ModelLayout layout, size_t expected_updates, int threads);

  // Writes base + aggregate into `out` (n floats, not aliasing `base`); updates.size() >= 1.
  virtual AggregationReport CombineSorted(const SortedUpdates& updates, const float* base,
                                          float* out) const = 0;

 private:
  struct Stored {
    std::string contributor;
    std::vector<float> delta;
  };

  absl::Status Fold(absl::Span<const float> delta, double weight,
                    absl::string_view contributor) final;
  absl::StatusOr<AggregationReport> Combine(const tensor::FlatModel& base,
                                            std::vector<float>& out) const final;
  void Clear() final { used_ = 0; }

  std::vector<Stored> stored_;  // the first used_ hold this round's updates; the rest are spares
  size_t used_ = 0;
};

// Coordinates per tile of a column pass: the tile (tile x K floats) stays in L1/L2.
inline size_t ColumnTile(size_t k) { return std::max<size_t>(16, 8192 / std::max<size_t>(k, 1)); }

// Calls fn(i, column) for every coordinate i in [0, updates.n), where `column` holds the K
// values updates.deltas[k][i] in id order, in scratch that fn may reorder. Tiles of coordinates
// are transposed first so that each column is contiguous. Split across `threads`; fn must only
// write what belongs to coordinate i.
template <typename Fn>
void ForEachColumn(const SortedUpdates& updates, int threads, const Fn& fn) {
  const size_t k = updates.size();
  const size_t tile = ColumnTile(k);
  ParallelFor(
      updates.n, threads,
      [&](size_t begin, size_t end) {
        std::vector<float> scratch(tile * k);
        for (size_t start = begin; start < end; start += tile) {
          const size_t len = std::min(tile, end - start);
          for (size_t u = 0; u < k; ++u) {
            const float* d = updates.deltas[u] + start;
            for (size_t j = 0; j < len; ++j) scratch[j * k + u] = d[j];
          }
          for (size_t j = 0; j < len; ++j) fn(start + j, absl::Span<float>(&scratch[j * k], k));
        }
      },
      /*min_per_thread=*/size_t{1} << 16);
}

// Sums that a pass over [0, n) accumulates into `width` doubles, e.g. K(K-1)/2 squared
// distances. fn(begin, end, sums) adds the contribution of [begin, end) to sums[0..width).
// The range is cut into a fixed number of stripes whose partial sums are added in stripe
// order, so the result does not depend on `threads`.
template <typename Fn>
std::vector<double> StripedSums(size_t n, int threads, size_t width, const Fn& fn) {
  constexpr size_t kStripes = 64;
  const size_t stripe = (n + kStripes - 1) / kStripes;
  std::vector<double> partial(kStripes * width, 0.0);
  // Small passes are not worth a thread.
  ParallelFor(
      kStripes, n < kMinFloatsPerThread / 4 ? 1 : threads,
      [&](size_t first, size_t last) {
        for (size_t s = first; s < last; ++s) {
          const size_t begin = std::min(n, s * stripe), end = std::min(n, begin + stripe);
          if (begin < end) fn(begin, end, &partial[s * width]);
        }
      },
      /*min_per_thread=*/1);
  std::vector<double> sums(width, 0.0);
  for (size_t s = 0; s < kStripes; ++s) {
    for (size_t w = 0; w < width; ++w) sums[w] += partial[s * width + w];
  }
  return sums;
}

// Squared L2 distance of a[0..n) and b[0..n), in double.
double SquaredDistance(const float* a, const float* b, size_t n);

// out[i] = base[i] + the coordinate-wise median of `updates` (even K: the mean of the two
// middle values). Shared by median and krum's fallback.
void CoordinateMedianInto(const SortedUpdates& updates, int threads, const float* base, float* out);

}  // namespace shoal::aggregation::internal
