#include "libs/privacy/secagg/update_codec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::privacy::secagg {

absl::StatusOr<FixedPointCodec> UpdateCodec(double clip_norm, int participants,
                                            double noise_stddev) {
  if (!std::isfinite(clip_norm) || !(clip_norm > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation's clip_norm must be finite and > 0, got ", clip_norm));
  }
  if (!std::isfinite(noise_stddev) || !(noise_stddev >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation's noise standard deviation must be finite and >= 0, got ",
                     noise_stddev));
  }
  if (participants < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation needs participants, got ", participants));
  }
  FixedPointOptions options;
  options.clip_range = NoisyValueRange(clip_norm, noise_stddev);
  options.max_summands = participants;
  options.bits = 32;
  return FixedPointCodec::Create(options);
}

double NoisyValueRange(double clip_norm, double noise_stddev) {
  return clip_norm + 8 * noise_stddev;
}

absl::StatusOr<std::vector<uint32_t>> ClipAndEncode(const FixedPointCodec& codec,
                                                    absl::Span<const float> update) {
  double sum_squares = 0;
  for (size_t i = 0; i < update.size(); ++i) {
    if (!std::isfinite(update[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("update value ", i, " is not finite (", update[i], ")"));
    }
    sum_squares += static_cast<double>(update[i]) * update[i];
  }
  const double range = codec.clip_range();
  const double norm = std::sqrt(sum_squares);
  const double factor = norm > range ? range / norm : 1.0;
  std::vector<float> clipped(update.begin(), update.end());
  const float bound = static_cast<float>(range);
  for (float& v : clipped) {
    // Rounding of the scaled value may pass the range by an ulp; the codec refuses that.
    v = std::clamp(static_cast<float>(v * factor), -bound, bound);
  }
  return codec.Encode(clipped);
}

absl::StatusOr<std::vector<uint32_t>> ClampAndEncode(const FixedPointCodec& codec,
                                                     absl::Span<const float> update) {
  const float bound = static_cast<float>(codec.clip_range());
  std::vector<float> clamped(update.begin(), update.end());
  for (size_t i = 0; i < clamped.size(); ++i) {
    if (!std::isfinite(clamped[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("update value ", i, " is not finite (", clamped[i], ")"));
    }
    // The float bound may round above the range by an ulp; the codec refuses what passes it.
    clamped[i] = std::clamp(clamped[i], -bound, bound);
    if (static_cast<double>(std::abs(clamped[i])) > codec.clip_range()) {
      clamped[i] = std::nextafter(clamped[i], 0.0F);
    }
  }
  return codec.Encode(clamped);
}

absl::StatusOr<std::vector<float>> ApplyMeanOfSum(const FixedPointCodec& codec,
                                                  absl::Span<const uint32_t> sum, int summands,
                                                  absl::Span<const float> base) {
  if (sum.size() != base.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the secure sum has ", sum.size(), " values, the model ", base.size()));
  }
  absl::StatusOr<std::vector<double>> decoded = codec.DecodeSum(sum, summands);
  if (!decoded.ok()) return decoded.status();
  std::vector<float> out(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    out[i] = static_cast<float>(base[i] + (*decoded)[i] / summands);
  }
  return out;
}

}  // namespace shoal::privacy::secagg
