#include "libs/aggregation/stored_updates.h"

#include <algorithm>
#include <numeric>

namespace shoal::aggregation::internal {

StoredUpdates::StoredUpdates(tensor::ModelLayout layout, size_t expected_updates, int threads)
    : Aggregation(std::move(layout), threads) {
  stored_.reserve(expected_updates);
}

absl::Status StoredUpdates::Fold(absl::Span<const float> delta, double /*weight*/,
                                 absl::string_view contributor) {
  if (used_ == stored_.size()) stored_.emplace_back();
  Stored& slot = stored_[used_];
  slot.contributor.assign(contributor.data(), contributor.size());
  // assign() reuses the spare's capacity from an earlier round.
  slot.delta.assign(delta.begin(), delta.end());
  ++used_;
  return absl::OkStatus();
}

absl::StatusOr<AggregationReport> StoredUpdates::Combine(const tensor::FlatModel& base,
                                                         std::vector<float>& out) const {
  std::vector<size_t> order(used_);
  std::iota(order.begin(), order.end(), size_t{0});
  // Contributors are unique within a round (Add refuses a second update), so this order is total.
  std::sort(order.begin(), order.end(),
            [this](size_t a, size_t b) { return stored_[a].contributor < stored_[b].contributor; });
  SortedUpdates sorted;
  sorted.n = base.values.size();
  for (size_t i : order) {
    sorted.deltas.push_back(stored_[i].delta.data());
    sorted.contributors.push_back(stored_[i].contributor);
  }
  out.resize(sorted.n);
  AggregationReport report = CombineSorted(sorted, base.values.data(), out.data());
  report.updates = used_;
  return report;
}

double SquaredDistance(const float* a, const float* b, size_t n) {
  // Independent lanes let the compiler vectorise without reordering one sum.
  double lanes[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) {
      const double d = static_cast<double>(a[i + j]) - b[i + j];
      lanes[j] += d * d;
    }
  }
  double total = 0;
  for (; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    total += d * d;
  }
  for (double l : lanes) total += l;
  return total;
}

void CoordinateMedianInto(const SortedUpdates& updates, int threads, const float* base,
                          float* out) {
  const size_t k = updates.size();
  const size_t mid = k / 2;
  ForEachColumn(updates, threads, [=](size_t i, absl::Span<float> column) {
    std::nth_element(column.begin(), column.begin() + mid, column.end());
    double median = column[mid];
    if (k % 2 == 0) {
      // The lower middle value is the largest of the lower half.
      const float lower = *std::max_element(column.begin(), column.begin() + mid);
      median = (static_cast<double>(lower) + median) * 0.5;
    }
    out[i] = base[i] + static_cast<float>(median);
  });
}

}  // namespace shoal::aggregation::internal
