#pragma once

// How a secure-aggregation round carries model updates (services/aggregator's secure round and
// the peers that take part): each peer clips its update to L2 norm clip_norm, so that every value
// lies in [-clip_norm, clip_norm], and encodes it in fixed point into Z_(2^32) for as many
// summands as the round has participants (fixed_point.h picks the scale). The aggregator decodes
// the survivors' exact ring sum and publishes base + sum / survivors (with peer-level DP: base +
// (sum + noise) / expected peers, services/aggregator/round_privacy.h).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/privacy/fixed_point.h"

namespace shoal::privacy::secagg {

// The codec of a round of `participants` peers clipping to `clip_norm`, whose updates then carry
// Gaussian noise of `noise_stddev` per value (peer-level DP with distributed noise; 0: none):
// values range over [-r, r] with r = NoisyValueRange(clip_norm, noise_stddev). Errors:
// INVALID_ARGUMENT naming clip_norm (not finite or not > 0), noise_stddev (negative or not
// finite) or the participants.
absl::StatusOr<FixedPointCodec> UpdateCodec(double clip_norm, int participants,
                                            double noise_stddev);

// clip_norm + 8 x noise_stddev: a value of a clipped update with N(0, noise_stddev²) added lies
// further out with probability under 10^-15.
double NoisyValueRange(double clip_norm, double noise_stddev);

// Scales `update` down to L2 norm codec.clip_range() when it is longer, and encodes it (round to
// nearest). Errors: INVALID_ARGUMENT naming the first value that is not finite.
absl::StatusOr<std::vector<uint32_t>> ClipAndEncode(const FixedPointCodec& codec,
                                                    absl::Span<const float> update);

// For an update that was clipped and then got its noise (UpdateCodec with noise_stddev > 0):
// clamps each value to [-r, r] (clipping the norm again would cut the noise) and encodes it.
// Errors: INVALID_ARGUMENT naming the first value that is not finite.
absl::StatusOr<std::vector<uint32_t>> ClampAndEncode(const FixedPointCodec& codec,
                                                     absl::Span<const float> update);

// ClipAndEncode and ClampAndEncode a block at a time, for a caller that masks each block as it is
// encoded (no buffer of the whole encoding): Clip / Clamp check the update as those do (the same
// errors, before any value is encoded) and EncodeTo writes the same values they return. Holds a
// view of `update`, which must outlive it.
class UpdateEncoder {
 public:
  static absl::StatusOr<UpdateEncoder> Clip(const FixedPointCodec& codec,
                                            absl::Span<const float> update);
  static absl::StatusOr<UpdateEncoder> Clamp(const FixedPointCodec& codec,
                                             absl::Span<const float> update);

  size_t size() const { return update_.size(); }
  // out[i] = the encoding of value start + i, for out.size() values from `start`
  // (start + out.size() <= size()). Errors: as ClipAndEncode's (a value the codec refuses).
  absl::Status EncodeTo(size_t start, absl::Span<uint32_t> out) const;

 private:
  UpdateEncoder(const FixedPointCodec& codec, absl::Span<const float> update, bool clamp,
                double factor)
      : codec_(codec), update_(update), clamp_(clamp), factor_(factor) {}

  FixedPointCodec codec_;
  absl::Span<const float> update_;
  bool clamp_;
  double factor_;  // Clip: the norm's scale (1 when within the range)
};

// base + (the decoded ring sum of `summands` encodings) / summands, as floats. Errors:
// INVALID_ARGUMENT when `sum` and `base` differ in length or the sum does not decode
// (FixedPointCodec::DecodeSum).
absl::StatusOr<std::vector<float>> ApplyMeanOfSum(const FixedPointCodec& codec,
                                                  absl::Span<const uint32_t> sum, int summands,
                                                  absl::Span<const float> base);

// As ApplyMeanOfSum, written into `out` (resized to base's length; a buffer kept from an earlier
// round keeps its memory, so no page of it is faulted in again). `out` is left as it was on an
// error.
absl::Status ApplyMeanOfSumInto(const FixedPointCodec& codec, absl::Span<const uint32_t> sum,
                                int summands, absl::Span<const float> base,
                                std::vector<float>& out);

}  // namespace shoal::privacy::secagg
