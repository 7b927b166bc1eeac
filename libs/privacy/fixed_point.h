#pragma once

// Fixed-point encoding of model updates into the ring Z_(2^k) that secure aggregation masks and
// sums in.
//
// A value x in [-r, r] becomes round(x · scale) as a k-bit two's-complement integer, stored in a
// uint32_t (the low k bits). Adding encodings mod 2^k adds the integers exactly as long as the
// true sum stays within [-2^(k-1), 2^(k-1)); the codec is built for at most N summands and
// refuses a (range, scale, N, k) for which N encodings of ±r could leave that interval, so a sum
// of up to N encodings never wraps. Decoding reads the sum as a signed integer and divides by the
// scale; it needs no count of summands to undo an offset.
//
// With the default power-of-two scale the quantum 1/scale is exact and decoding into double is
// exact; each value is off by at most quantum/2 (round to nearest) or less than one quantum
// (stochastic rounding, unbiased), so a sum of N decodes within N · quantum / 2 (resp. N ·
// quantum) of the sum of the inputs.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shoal::privacy {

struct FixedPointOptions {
  // r: every value to encode lies in [-r, r] (the caller clips). Finite, > 0.
  double clip_range = 0;
  // N: the most encodings that will be added before decoding (the peers of a round). ≥ 1.
  int max_summands = 1;
  // k: the ring is Z_(2^k), 2..32. 0 picks the smallest k that holds N sums at `scale` (which must
  // then be given).
  int bits = 32;
  // Encoded units per 1.0; the quantum is 1/scale. 0 picks the largest power of two for which N
  // sums of [-r, r] fit in k bits.
  double scale = 0;
};

// Encodes float vectors into Z_(2^k) and decodes sums of them. Immutable once created, so
// thread-safe; cheap to copy.
class FixedPointCodec {
 public:
  // Errors: INVALID_ARGUMENT naming the option that is out of range, or saying why N sums of
  // [-r, r] at this scale cannot fit in k bits.
  static absl::StatusOr<FixedPointCodec> Create(const FixedPointOptions& options);

  // Round to nearest. Errors: INVALID_ARGUMENT naming the first value (index and value) that is
  // not finite or lies outside [-r, r].
  absl::StatusOr<std::vector<uint32_t>> Encode(absl::Span<const float> values) const;
  // Stochastic rounding: x · scale rounds up with probability equal to its fractional part, so
  // the encoding is unbiased; `seed` makes it reproducible. Errors as Encode.
  absl::StatusOr<std::vector<uint32_t>> EncodeStochastic(absl::Span<const float> values,
                                                         uint64_t seed) const;

  // Decodes the mod-2^k sum of `summands` encodings (1 ≤ summands ≤ N). Errors:
  // INVALID_ARGUMENT on a summand count out of range, an element with bits above k, or an
  // element whose value no `summands` encodings could sum to (masks not removed, or the sum is
  // of more encodings than said).
  absl::StatusOr<std::vector<double>> DecodeSum(absl::Span<const uint32_t> sum, int summands) const;

  // The pieces of Encode and DecodeSum for callers that fuse them with their own pass over the
  // values (secagg/update_codec.h), with the same results.
  // Encode's error for `value` at `index`: OK when it is finite and within [-r, r].
  absl::Status CheckValue(size_t index, float value) const;
  // Encode's element: round(value · scale) to nearest, ties away from zero (std::llround), in
  // the ring; `value` must pass CheckValue.
  uint32_t EncodeValue(float value) const {
    const double x = static_cast<double>(value) * scale_;
    // Truncated, then rounded by the rest: x - v is exact (|x| < 2^62 and |v| >= |x| / 2 or 0).
    // Branch-free: the rests of real updates are as good as random.
    int64_t v = static_cast<int64_t>(x);
    const double rest = x - static_cast<double>(v);
    v += static_cast<int64_t>(rest >= 0.5) - static_cast<int64_t>(rest <= -0.5);
    return static_cast<uint32_t>(static_cast<uint64_t>(v)) & mask_;
  }
  // DecodeSum's errors, without decoding.
  absl::Status CheckSum(absl::Span<const uint32_t> sum, int summands) const;
  // DecodeSum's element: an element of a sum that passed CheckSum, as a double.
  double DecodeValue(uint32_t element) const {
    const int64_t modulus = int64_t{1} << bits_;
    int64_t v = element;
    if (v >= modulus / 2) v -= modulus;
    return static_cast<double>(v) / scale_;
  }

  int bits() const { return bits_; }
  double scale() const { return scale_; }
  double quantum() const { return 1 / scale_; }
  double clip_range() const { return clip_range_; }
  int max_summands() const { return max_summands_; }
  // 2^k - 1: ring elements are the uint32_t values up to it.
  uint32_t mask() const { return mask_; }
  // The largest |integer| one encoding can hold: ceil(r · scale).
  int64_t max_magnitude() const { return max_magnitude_; }

 private:
  FixedPointCodec(double clip_range, int max_summands, int bits, double scale,
                  int64_t max_magnitude);

  double clip_range_;
  int max_summands_;
  int bits_;
  double scale_;
  int64_t max_magnitude_;
  uint32_t mask_;
};

}  // namespace shoal::privacy
