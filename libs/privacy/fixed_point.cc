#include "libs/privacy/fixed_point.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"

namespace shoal::privacy {
namespace {

constexpr int kMinBits = 2;
constexpr int kMaxBits = 32;

// The largest |sum| k-bit two's complement holds: 2^(k-1) - 1.
int64_t SumLimit(int bits) { return (int64_t{1} << (bits - 1)) - 1; }

// ceil(r · scale), or -1 when it is too large to be of use (over 2^62).
int64_t MaxMagnitude(double clip_range, double scale) {
  const double m = std::ceil(clip_range * scale);
  if (!(m < 0x1p62)) return -1;
  return static_cast<int64_t>(m);
}

bool Fits(int64_t max_magnitude, int summands, int bits) {
  return max_magnitude >= 0 && max_magnitude <= SumLimit(bits) / summands;
}

}  // namespace

FixedPointCodec::FixedPointCodec(double clip_range, int max_summands, int bits, double scale,
                                 int64_t max_magnitude)
    : clip_range_(clip_range),
      max_summands_(max_summands),
      bits_(bits),
      scale_(scale),
      max_magnitude_(max_magnitude),
      mask_(bits == 32 ? 0xffffffffu : (uint32_t{1} << bits) - 1) {}

absl::StatusOr<FixedPointCodec> FixedPointCodec::Create(const FixedPointOptions& options) {
  const double r = options.clip_range;
  const int n = options.max_summands;
  if (!(r > 0) || !std::isfinite(r)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: clip_range must be finite and > 0, got ", r));
  }
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: max_summands must be >= 1, got ", n));
  }
  if (options.bits != 0 && (options.bits < kMinBits || options.bits > kMaxBits)) {
    return absl::InvalidArgumentError(absl::StrCat("fixed point: bits must be in [", kMinBits, ", ",
                                                   kMaxBits, "] (or 0 to choose), got ",
                                                   options.bits));
  }
  if (options.scale < 0 || !std::isfinite(options.scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fixed point: scale must be finite and > 0 (or 0 to choose), got ", options.scale));
  }

  double scale = options.scale;
  int bits = options.bits;
  if (scale == 0) {
    if (bits == 0) {
      return absl::InvalidArgumentError(
          "fixed point: bits = 0 (choose the ring) needs a scale; give bits, scale or both");
    }
    // The largest power of two with n · ceil(r · 2^e) ≤ 2^(k-1) - 1.
    // At least two units per value (the ends of the range apart from 0), or there is no
    // precision to speak of.
    if (2 * static_cast<int64_t>(n) > SumLimit(bits)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fixed point: ", bits, " bits cannot hold the sum of ", n, " values in [-",
                       r, ", ", r, "] with any precision; use more bits or fewer summands"));
    }
    const double limit = static_cast<double>(SumLimit(bits)) / n;
    int e = static_cast<int>(std::clamp(std::floor(std::log2(limit / r)), -1000.0, 1000.0));
    // The estimate is at most one or two too high (ceil, and the clamp's far end for extreme r).
    while (e > -1074 && !Fits(MaxMagnitude(r, std::ldexp(1.0, e)), n, bits)) --e;
    scale = std::ldexp(1.0, e);
    if (MaxMagnitude(r, scale) < 2) {
      return absl::InvalidArgumentError(absl::StrCat("fixed point: no power-of-two scale fits ", n,
                                                     " values in [-", r, ", ", r, "] into ", bits,
                                                     " bits; give a scale"));
    }
  } else if (bits == 0) {
    const int64_t m = MaxMagnitude(r, scale);
    bits = kMinBits;
    while (bits <= kMaxBits && !Fits(m, n, bits)) ++bits;
    if (bits > kMaxBits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fixed point: the sum of ", n, " values in [-", r, ", ", r, "] at scale ", scale,
          " needs more than ", kMaxBits, " bits; lower the scale, the range or the summands"));
    }
  }
  const int64_t m = MaxMagnitude(r, scale);
  if (m < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: clip_range x scale (", r, " x ", scale, ") is beyond any ring"));
  }
  if (!Fits(m, n, bits)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fixed point: the sum of ", n, " values in [-", r, ", ", r, "] at scale ", scale,
        " reaches ", n, " x ", m, ", beyond the ", SumLimit(bits), " that ", bits,
        " bits hold: it could wrap; lower the scale, the range or the summands, or add bits"));
  }
  return FixedPointCodec(r, n, bits, scale, m);
}

absl::Status FixedPointCodec::CheckValue(size_t index, float value) const {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed point: value ", index, " is not finite (", value, ")"));
  }
  if (std::abs(static_cast<double>(value)) > clip_range_) {
    return absl::InvalidArgumentError(absl::StrCat("fixed point: value ", index, " (", value,
                                                   ") is outside [-", clip_range_, ", ",
                                                   clip_range_, "]; clip before encoding"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> FixedPointCodec::Encode(
    absl::Span<const float> values) const {
  const FixedPointCodec local = *this;  // its fields stay in registers across the stores to out
  std::vector<uint32_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    // Not finite (NaN included) or out of range; CheckValue names which.
    if (!(std::abs(static_cast<double>(values[i])) <= clip_range_)) return CheckValue(i, values[i]);
    out[i] = local.EncodeValue(values[i]);
  }
  return out;
}

absl::StatusOr<std::vector<uint32_t>> FixedPointCodec::EncodeStochastic(
    absl::Span<const float> values, uint64_t seed) const {
  // mt19937_64's output is fixed by the standard; the uniform draw is built from its bits (not
  // from a distribution, whose algorithm is the library's) so a seed gives the same encoding on
  // every platform.
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (absl::Status s = CheckValue(i, values[i]); !s.ok()) return s;
    const double x = static_cast<double>(values[i]) * scale_;
    const double low = std::floor(x);
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53;  // uniform in [0, 1)
    const int64_t v = static_cast<int64_t>(low) + (u < x - low ? 1 : 0);
    out[i] = static_cast<uint32_t>(static_cast<uint64_t>(v)) & mask_;
  }
  return out;
}

absl::Status FixedPointCodec::CheckSum(absl::Span<const uint32_t> sum, int summands) const {
  if (summands < 1 || summands > max_summands_) {
    return absl::InvalidArgumentError(absl::StrCat("fixed point: a sum of ", summands,
                                                   " encodings; this codec holds 1 to ",
                                                   max_summands_, " without wrapping"));
  }
  // An element passes when it is in the ring and its signed value v has |v| <= bound, that is
  // when it lies in [0, bound] or in [2^k - bound, 2^k - 1].
  const int64_t bound = max_magnitude_ * summands;
  const int64_t modulus = int64_t{1} << bits_;
  for (size_t i = 0; i < sum.size(); ++i) {
    const int64_t e = sum[i];
    if (e <= bound || (e >= modulus - bound && e < modulus)) continue;
    if ((sum[i] & ~mask_) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fixed point: element ", i, " (", sum[i], ") is not in Z_2^", bits_));
    }
    int64_t v = sum[i];
    if (v > SumLimit(bits_)) v -= modulus;
    return absl::InvalidArgumentError(absl::StrCat(
        "fixed point: element ", i, " decodes to ", v, ", beyond the ", bound, " that ", summands,
        " encodings can sum to (masks left in, or more summands than said)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> FixedPointCodec::DecodeSum(absl::Span<const uint32_t> sum,
                                                               int summands) const {
  if (absl::Status s = CheckSum(sum, summands); !s.ok()) return s;
  std::vector<double> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) out[i] = DecodeValue(sum[i]);
  return out;
}

}  // namespace shoal::privacy
