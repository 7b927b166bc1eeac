#include "libs/aggregation/weighted_mean.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/parallel_for.h"

namespace shoal::aggregation {

using internal::ParallelFor;

WeightedMeanAccumulator::WeightedMeanAccumulator(tensor::ModelLayout layout, int threads)
    : layout_(std::move(layout)), threads_(threads) {}

absl::Status WeightedMeanAccumulator::Add(absl::Span<const float> delta, double weight) {
  if (delta.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta has ", delta.size(), " values; the model has ", layout_.total_elements()));
  }
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::InvalidArgumentError(absl::StrCat("update weight ", weight, " must be > 0"));
  }
  const float w = static_cast<float>(weight);
  const size_t n = delta.size();
  const float* d = delta.data();
  if (count_ == 0) {
    sum_.resize(n);
    float* s = sum_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) s[i] = w * d[i];
    });
  } else {
    float* s = sum_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) s[i] += w * d[i];
    });
  }
  ++count_;
  total_weight_ += weight;
  return absl::OkStatus();
}

absl::StatusOr<tensor::FlatModel> WeightedMeanAccumulator::Apply(
    const tensor::FlatModel& base) const {
  tensor::FlatModel out;
  absl::Status s = ApplyInto(base, out.values);
  if (!s.ok()) return s;
  out.layout = layout_;
  return out;
}

absl::Status WeightedMeanAccumulator::ApplyInto(const tensor::FlatModel& base,
                                                std::vector<float>& out) const {
  if (!(base.layout == layout_) || base.values.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError("base model does not match the accumulator's layout");
  }
  if (count_ == 0) {
    out.assign(base.values.begin(), base.values.end());
    return absl::OkStatus();
  }
  out.resize(base.values.size());
  const float scale = static_cast<float>(1.0 / total_weight_);
  const float* b = base.values.data();
  const float* s = sum_.data();
  float* o = out.data();
  ParallelFor(out.size(), threads_, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) o[i] = b[i] + s[i] * scale;
  });
  return absl::OkStatus();
}

std::vector<float> WeightedMeanAccumulator::MeanDelta() const {
  std::vector<float> out(layout_.total_elements(), 0.0f);
  if (count_ == 0) return out;
  const float scale = static_cast<float>(1.0 / total_weight_);
  for (size_t i = 0; i < out.size(); ++i) out[i] = sum_[i] * scale;
  return out;
}

void WeightedMeanAccumulator::Reset() {
  count_ = 0;
  total_weight_ = 0;
}

}  // namespace shoal::aggregation
