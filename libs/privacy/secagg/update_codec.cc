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
  const float bound = static_cast<float>(range);
  // A copy, whose fields the stores to `out` cannot alias: they stay in registers.
  const FixedPointCodec local = codec;
  std::vector<uint32_t> out(update.size());
  for (size_t i = 0; i < update.size(); ++i) {
    // Rounding of the scaled value may pass the range by an ulp; the codec refuses that.
    const float v = std::clamp(static_cast<float>(update[i] * factor), -bound, bound);
    if (!(std::abs(static_cast<double>(v)) <= range)) return codec.CheckValue(i, v);
    out[i] = local.EncodeValue(v);
  }
  return out;
}

absl::StatusOr<std::vector<uint32_t>> ClampAndEncode(const FixedPointCodec& codec,
                                                     absl::Span<const float> update) {
  const float bound = static_cast<float>(codec.clip_range());
  const FixedPointCodec local = codec;  // as in ClipAndEncode
  std::vector<uint32_t> out(update.size());
  for (size_t i = 0; i < update.size(); ++i) {
    if (!std::isfinite(update[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("update value ", i, " is not finite (", update[i], ")"));
    }
    // The float bound may round above the range by an ulp; the codec refuses what passes it.
    float v = std::clamp(update[i], -bound, bound);
    if (static_cast<double>(std::abs(v)) > codec.clip_range()) v = std::nextafter(v, 0.0F);
    if (!(std::abs(static_cast<double>(v)) <= codec.clip_range())) return codec.CheckValue(i, v);
    out[i] = local.EncodeValue(v);
  }
  return out;
}

absl::StatusOr<std::vector<float>> ApplyMeanOfSum(const FixedPointCodec& codec,
                                                  absl::Span<const uint32_t> sum, int summands,
                                                  absl::Span<const float> base) {
  if (sum.size() != base.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the secure sum has ", sum.size(), " values, the model ", base.size()));
  }
  if (absl::Status s = codec.CheckSum(sum, summands); !s.ok()) return s;
  std::vector<float> out(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    out[i] = static_cast<float>(base[i] + codec.DecodeValue(sum[i]) / summands);
  }
  return out;
}

}  // namespace shoal::privacy::secagg
