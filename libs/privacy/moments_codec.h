#pragma once

// The fixed-point encoding of one peer's federation-statistics moments (data::FeatureMoments:
// the count, per feature the sum and the sum of squares) into the ring Z_(2^32) that secure
// aggregation masks and adds in, and the decoding of a sum of such encodings.
//
// Each of the 1 + 2F values (count, sums, sums of squares) becomes a 96-bit two's-complement
// integer round(value x scale), written as 6 ring elements of 16 bits each, the lowest first.
// Adding encodings element by element never wraps for up to kMaxMomentsPeers peers (each sum of
// 16-bit limbs stays below 2^32), and the limbs of the sum put back together give the exact sum
// of the peers' integers. The scales follow from the declared bound B on |x| of every feature
// value (privacy.secure_aggregation.feature_bound), rounded up to a power of two B':
//   count: 1 (exact), at most kMaxMomentsCount per peer;
//   sum: 2^46 / B' (quantum B' x 2^-46), |sum| <= count x B;
//   sum of squares: 2^46 / B'^2 (quantum B'^2 x 2^-46), sum of squares <= count x B^2;
// so that the sum over kMaxMomentsPeers peers of kMaxMomentsCount samples each stays below 2^94.
// A peer's decoded share is off by at most half a quantum per value (round to nearest); a sum of
// N peers by N / 2 quanta.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/data/feature_moments.h"

namespace shoal::privacy {

inline constexpr int kMomentsLimbs = 6;                          // 16-bit ring elements per value
inline constexpr uint64_t kMaxMomentsCount = uint64_t{1} << 32;  // samples of one peer
inline constexpr int kMaxMomentsPeers = 65536;                   // encodings in one sum

class MomentsCodec {
 public:
  // `features` > 0 (at most 2^20), `bound` > 0 and finite. Errors: INVALID_ARGUMENT naming which.
  static absl::StatusOr<MomentsCodec> Create(size_t features, double bound);

  // The ring elements of one encoding: kMomentsLimbs x (1 + 2 x features).
  size_t length() const { return kMomentsLimbs * (1 + 2 * features_); }
  double sum_quantum() const { return 1 / sum_scale_; }
  double square_quantum() const { return 1 / square_scale_; }

  // Errors: INVALID_ARGUMENT when the moments fail data::CheckMoments, have another number of
  // features, more than kMaxMomentsCount samples, or a feature whose sum or sum of squares lies
  // beyond what `bound` allows (naming the feature, with its name from `names` when given: some
  // value of it is beyond the bound).
  absl::StatusOr<std::vector<uint32_t>> Encode(const data::FeatureMoments& moments,
                                               absl::Span<const std::string> names = {}) const;

  // The moments of the ring sum of `summands` encodings (1..kMaxMomentsPeers). Errors:
  // INVALID_ARGUMENT a sum of another length, an element no `summands` encodings could add up to
  // (masks left in it), or a count of 0.
  absl::StatusOr<data::FeatureMoments> DecodeSum(absl::Span<const uint32_t> sum,
                                                 int summands) const;

 private:
  MomentsCodec(size_t features, double bound, double sum_scale, double square_scale)
      : features_(features), bound_(bound), sum_scale_(sum_scale), square_scale_(square_scale) {}

  size_t features_;
  double bound_;
  double sum_scale_;
  double square_scale_;
};

}  // namespace shoal::privacy
