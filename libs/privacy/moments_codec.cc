#include "libs/privacy/moments_codec.h"

#include <cmath>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"

namespace shoal::privacy {
namespace {

constexpr int kLimbBits = 16;
constexpr int kValueBits = kMomentsLimbs * kLimbBits;  // 96
constexpr int kFractionBits = 46;
constexpr size_t kMaxFeatures = size_t{1} << 20;

// round(x) as a 96-bit two's-complement integer, into `out`'s kMomentsLimbs elements.
void PutValue(double x, uint32_t* out) {
  const absl::uint128 u = static_cast<absl::uint128>(absl::int128(std::nearbyint(x)));
  for (int k = 0; k < kMomentsLimbs; ++k) {
    out[k] = static_cast<uint32_t>(absl::Uint128Low64(u >> (kLimbBits * k)) & 0xffffu);
  }
}

// The integer whose 96-bit encodings' limbs add up to `limbs`.
double GetValue(const uint32_t* limbs) {
  absl::uint128 u = 0;
  for (int k = 0; k < kMomentsLimbs; ++k) u += absl::uint128(limbs[k]) << (kLimbBits * k);
  u &= (absl::uint128(1) << kValueBits) - 1;
  absl::int128 v = static_cast<absl::int128>(u);
  if ((u >> (kValueBits - 1)) != 0) v -= absl::int128(1) << kValueBits;
  return static_cast<double>(v);
}

}  // namespace

absl::StatusOr<MomentsCodec> MomentsCodec::Create(size_t features, double bound) {
  if (features == 0 || features > kMaxFeatures) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments codec: ", features, " features, must be 1..", kMaxFeatures));
  }
  if (!(bound > 0) || !std::isfinite(bound) || bound > 1e30) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments codec: feature_bound must be > 0 and at most 1e30, got ", bound));
  }
  const int exponent = std::ilogb(bound) + (bound == std::ldexp(1.0, std::ilogb(bound)) ? 0 : 1);
  const double sum_scale = std::ldexp(1.0, kFractionBits - exponent);
  const double square_scale = std::ldexp(1.0, kFractionBits - 2 * exponent);
  return MomentsCodec(features, bound, sum_scale, square_scale);
}

absl::StatusOr<std::vector<uint32_t>> MomentsCodec::Encode(
    const data::FeatureMoments& moments, absl::Span<const std::string> names) const {
  if (absl::Status s = data::CheckMoments(moments); !s.ok()) return s;
  if (moments.sum.size() != features_) {
    return absl::InvalidArgumentError(absl::StrCat("moments: ", moments.sum.size(),
                                                   " features, the encoding is for ", features_));
  }
  if (moments.count > kMaxMomentsCount) {
    return absl::InvalidArgumentError(absl::StrCat("moments: ", moments.count,
                                                   " samples, over the limit of ", kMaxMomentsCount,
                                                   " for secure aggregation"));
  }
  const double n = static_cast<double>(moments.count);
  for (size_t j = 0; j < features_; ++j) {
    if (std::abs(moments.sum[j]) > n * bound_ || moments.sum_squares[j] > n * bound_ * bound_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moments: feature ", j, j < names.size() ? absl::StrCat(" (", names[j], ")") : "",
          " has values beyond privacy.secure_aggregation.feature_bound ", bound_, " (mean ",
          moments.sum[j] / n, ", mean square ", moments.sum_squares[j] / n, ")"));
    }
  }
  std::vector<uint32_t> out(length());
  PutValue(n, out.data());
  for (size_t j = 0; j < features_; ++j) {
    PutValue(moments.sum[j] * sum_scale_, &out[kMomentsLimbs * (1 + j)]);
    PutValue(moments.sum_squares[j] * square_scale_, &out[kMomentsLimbs * (1 + features_ + j)]);
  }
  return out;
}

absl::StatusOr<data::FeatureMoments> MomentsCodec::DecodeSum(absl::Span<const uint32_t> sum,
                                                             int summands) const {
  if (summands < 1 || summands > kMaxMomentsPeers) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments: ", summands, " summands, must be 1..", kMaxMomentsPeers));
  }
  if (sum.size() != length()) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments: a sum of ", sum.size(), " ring elements, expected ", length()));
  }
  const uint64_t most = static_cast<uint64_t>(summands) * 0xffffu;
  for (size_t i = 0; i < sum.size(); ++i) {
    if (sum[i] > most) {
      return absl::InvalidArgumentError(absl::StrCat("moments: ring element ", i, " of the sum (",
                                                     sum[i], ") is more than ", summands,
                                                     " encodings add up to (masks left in it?)"));
    }
  }
  data::FeatureMoments m;
  const double count = GetValue(sum.data());
  if (!(count >= 1)) return absl::InvalidArgumentError("moments: the sum's count is not > 0");
  m.count = static_cast<uint64_t>(count);
  m.sum.resize(features_);
  m.sum_squares.resize(features_);
  for (size_t j = 0; j < features_; ++j) {
    m.sum[j] = GetValue(&sum[kMomentsLimbs * (1 + j)]) / sum_scale_;
    m.sum_squares[j] = GetValue(&sum[kMomentsLimbs * (1 + features_ + j)]) / square_scale_;
  }
  return m;
}

}  // namespace shoal::privacy
