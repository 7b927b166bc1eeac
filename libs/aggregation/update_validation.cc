#include "libs/aggregation/update_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shoal::aggregation {

absl::Status CheckFinite(const tensor::FlatModel& update) {
  const auto& layout = update.layout;
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    const size_t begin = layout.offset(t);
    const size_t n = static_cast<size_t>(layout.tensors()[t].NumElements());
    for (size_t i = 0; i < n; ++i) {
      const float v = update.values[begin + i];
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", layout.tensors()[t].name, "': non-finite value ", v, " at element ", i));
      }
    }
  }
  return absl::OkStatus();
}

double L2Norm(absl::Span<const float> values) {
  double lanes[8] = {};
  size_t i = 0;
  const size_t n = values.size();
  const float* x = values.data();
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  double total = 0;
  for (; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  for (double l : lanes) total += l;
  return std::sqrt(total);
}

double DifferenceL2Norm(absl::Span<const float> x, absl::Span<const float> base,
                        absl::Span<float> out) {
  // L2Norm's lanes and order over the differences as they are written.
  double lanes[8] = {};
  size_t i = 0;
  const size_t n = out.size();
  const float* __restrict a = x.data();
  const float* __restrict b = base.data();
  float* __restrict d = out.data();
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) {
      d[i + j] = a[i + j] - b[i + j];
      lanes[j] += static_cast<double>(d[i + j]) * d[i + j];
    }
  }
  double total = 0;
  for (; i < n; ++i) {
    d[i] = a[i] - b[i];
    total += static_cast<double>(d[i]) * d[i];
  }
  for (double l : lanes) total += l;
  return std::sqrt(total);
}

absl::Status CheckNormBound(double norm, double max_norm) {
  if (max_norm <= 0) return absl::OkStatus();
  if (!(norm <= max_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("update L2 norm ", norm, " exceeds the bound ", max_norm));
  }
  return absl::OkStatus();
}

absl::Status CheckLayout(const tensor::FlatModel& update, const tensor::ModelLayout& expected) {
  const auto& got = update.layout.tensors();
  const auto& want = expected.tensors();
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i].name != want[i].name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor #", i, " is '", got[i].name, "' but the model expects '", want[i].name, "'"));
    }
    if (got[i].shape != want[i].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", got[i].name, "': shape [", absl::StrJoin(got[i].shape, ","),
                       "] does not match the model's [", absl::StrJoin(want[i].shape, ","), "]"));
    }
  }
  if (got.size() != want.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("update has ", got.size(), " tensors; the model has ", want.size()));
  }
  if (update.values.size() != expected.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update has ", update.values.size(), " values; the model has ", expected.total_elements()));
  }
  return absl::OkStatus();
}

}  // namespace shoal::aggregation
