#include "libs/data/feature_moments.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace shoal::data {

absl::StatusOr<FeatureMoments> ComputeMoments(const Dataset& data,
                                              const std::vector<int64_t>& rows) {
  const size_t size = data.SampleSize();
  if (data.values.size() != data.count * size) {
    return absl::InvalidArgumentError(absl::StrCat("moments: ", data.values.size(), " values for ",
                                                   data.count, " samples of ", size));
  }
  if (rows.empty()) return absl::InvalidArgumentError("moments: no training samples");
  const size_t n = data.FeatureCount();
  const size_t per = data.ValuesPerFeature();
  FeatureMoments m;
  m.sum.assign(n, 0.0);
  m.sum_squares.assign(n, 0.0);
  for (int64_t r : rows) {
    if (r < 0 || static_cast<size_t>(r) >= data.count) {
      return absl::InvalidArgumentError(
          absl::StrCat("moments: sample ", r, " out of range (", data.count, " samples)"));
    }
    const float* row = data.values.data() + static_cast<size_t>(r) * size;
    for (size_t j = 0; j < n; ++j) {
      for (const float* v = row + j * per; v != row + (j + 1) * per; ++v) {
        const double x = *v;
        if (!std::isfinite(x)) {
          return absl::InvalidArgumentError(absl::StrCat("moments: sample ", r, ", ",
                                                         data.IsImage() ? "channel " : "feature ",
                                                         j, " is not finite"));
        }
        m.sum[j] += x;
        m.sum_squares[j] += x * x;
      }
    }
  }
  if (per > 1) {
    // Per sample, not per pixel: count stays the number of images, and the statistics are those
    // of every pixel all the same (the pixels per image are the same on every peer).
    for (size_t j = 0; j < n; ++j) {
      m.sum[j] /= static_cast<double>(per);
      m.sum_squares[j] /= static_cast<double>(per);
    }
  }
  m.count = rows.size();
  return m;
}

absl::Status CheckMoments(const FeatureMoments& m) {
  if (m.count == 0) return absl::InvalidArgumentError("moments: count must be > 0");
  if (m.sum.empty() || m.sum.size() != m.sum_squares.size()) {
    return absl::InvalidArgumentError(absl::StrCat("moments: ", m.sum.size(), " sums and ",
                                                   m.sum_squares.size(),
                                                   " sums of squares (one of each per feature)"));
  }
  for (size_t j = 0; j < m.sum.size(); ++j) {
    if (!std::isfinite(m.sum[j]) || !std::isfinite(m.sum_squares[j]) || m.sum_squares[j] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("moments: feature ", j, ": sum ", m.sum[j], " and sum of squares ",
                       m.sum_squares[j], " (both must be finite, the sum of squares >= 0)"));
    }
  }
  return absl::OkStatus();
}

absl::Status AddMoments(FeatureMoments& total, const FeatureMoments& part) {
  if (absl::Status s = CheckMoments(part); !s.ok()) return s;
  if (total.count == 0 && total.sum.empty()) {
    total = part;
    return absl::OkStatus();
  }
  if (part.sum.size() != total.sum.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moments: ", part.sum.size(), " features, but the others have ", total.sum.size()));
  }
  total.count += part.count;
  for (size_t j = 0; j < part.sum.size(); ++j) {
    total.sum[j] += part.sum[j];
    total.sum_squares[j] += part.sum_squares[j];
  }
  return absl::OkStatus();
}

absl::StatusOr<FeatureStatistics> StatisticsFromMoments(const FeatureMoments& m) {
  if (absl::Status s = CheckMoments(m); !s.ok()) return s;
  // E[x^2] - mean^2 cancels when the mean dwarfs the spread: in long double (64-bit mantissa
  // on x86) the subtraction itself loses nothing more than the sums already did. What is left
  // below a few ulps of E[x^2] (in double) is rounding, not spread.
  const long double n = static_cast<long double>(m.count);
  FeatureStatistics s;
  s.mean.resize(m.sum.size());
  s.stddev.resize(m.sum.size());
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  for (size_t j = 0; j < m.sum.size(); ++j) {
    const long double mean_l = static_cast<long double>(m.sum[j]) / n;
    const long double second = static_cast<long double>(m.sum_squares[j]) / n;
    const long double variance = second - mean_l * mean_l;
    const long double noise = 8 * std::numeric_limits<double>::epsilon() * second;
    const double mean = static_cast<double>(mean_l);
    const double sd = variance > noise ? static_cast<double>(std::sqrt(variance)) : 1.0;
    if (!std::isfinite(mean) || std::fabs(mean) > kFloatMax || !std::isfinite(sd) ||
        sd > kFloatMax) {
      return absl::InvalidArgumentError(absl::StrCat("moments: feature ", j, ": mean ", mean,
                                                     " or standard deviation ", sd,
                                                     " is not a finite float"));
    }
    s.mean[j] = mean;
    s.stddev[j] = sd;
  }
  return s;
}

}  // namespace shoal::data
