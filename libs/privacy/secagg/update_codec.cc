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

namespace {

absl::Status CheckFinite(absl::Span<const float> update) {
  for (size_t i = 0; i < update.size(); ++i) {
    if (!std::isfinite(update[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("update value ", i, " is not finite (", update[i], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UpdateEncoder> UpdateEncoder::Clip(const FixedPointCodec& codec,
                                                  absl::Span<const float> update) {
  double sum_squares = 0;
  for (size_t i = 0; i < update.size(); ++i) {
    if (!std::isfinite(update[i])) return CheckFinite(update.subspan(0, i + 1));
    sum_squares += static_cast<double>(update[i]) * update[i];
  }
  const double range = codec.clip_range();
  const double norm = std::sqrt(sum_squares);
  return UpdateEncoder(codec, update, /*clamp=*/false, norm > range ? range / norm : 1.0);
}

absl::StatusOr<UpdateEncoder> UpdateEncoder::Clamp(const FixedPointCodec& codec,
                                                   absl::Span<const float> update) {
  if (absl::Status s = CheckFinite(update); !s.ok()) return s;
  return UpdateEncoder(codec, update, /*clamp=*/true, 1.0);
}

absl::Status UpdateEncoder::EncodeTo(size_t start, absl::Span<uint32_t> out) const {
  // Locals, which the stores to `out` cannot alias: they stay in registers.
  const FixedPointCodec local = codec_;
  const double range = local.clip_range();
  const float bound = static_cast<float>(range);
  const float* in = update_.data() + start;
  uint32_t* o = out.data();
  const size_t n = out.size();
  if (!clamp_) {
    const double factor = factor_;
    for (size_t i = 0; i < n; ++i) {
      // Rounding of the scaled value may pass the range by an ulp; the codec refuses that.
      const float v = std::clamp(static_cast<float>(in[i] * factor), -bound, bound);
      if (!(std::abs(static_cast<double>(v)) <= range)) return codec_.CheckValue(start + i, v);
      o[i] = local.EncodeValue(v);
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < n; ++i) {
    // The float bound may round above the range by an ulp; the codec refuses what passes it.
    float v = std::clamp(in[i], -bound, bound);
    if (static_cast<double>(std::abs(v)) > range) v = std::nextafter(v, 0.0F);
    if (!(std::abs(static_cast<double>(v)) <= range)) return codec_.CheckValue(start + i, v);
    o[i] = local.EncodeValue(v);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> ClipAndEncode(const FixedPointCodec& codec,
                                                    absl::Span<const float> update) {
  absl::StatusOr<UpdateEncoder> encoder = UpdateEncoder::Clip(codec, update);
  if (!encoder.ok()) return encoder.status();
  std::vector<uint32_t> out(update.size());
  if (absl::Status s = encoder->EncodeTo(0, absl::MakeSpan(out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<uint32_t>> ClampAndEncode(const FixedPointCodec& codec,
                                                     absl::Span<const float> update) {
  absl::StatusOr<UpdateEncoder> encoder = UpdateEncoder::Clamp(codec, update);
  if (!encoder.ok()) return encoder.status();
  std::vector<uint32_t> out(update.size());
  if (absl::Status s = encoder->EncodeTo(0, absl::MakeSpan(out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<float>> ApplyMeanOfSum(const FixedPointCodec& codec,
                                                  absl::Span<const uint32_t> sum, int summands,
                                                  absl::Span<const float> base) {
  std::vector<float> out;
  if (absl::Status s = ApplyMeanOfSumInto(codec, sum, summands, base, out); !s.ok()) return s;
  return out;
}

absl::Status ApplyMeanOfSumInto(const FixedPointCodec& codec, absl::Span<const uint32_t> sum,
                                int summands, absl::Span<const float> base,
                                std::vector<float>& out) {
  if (sum.size() != base.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the secure sum has ", sum.size(), " values, the model ", base.size()));
  }
  if (absl::Status s = codec.CheckSum(sum, summands); !s.ok()) return s;
  out.resize(base.size());
  float* values = out.data();
  for (size_t i = 0; i < base.size(); ++i) {
    values[i] = static_cast<float>(base[i] + codec.DecodeValue(sum[i]) / summands);
  }
  return absl::OkStatus();
}

}  // namespace shoal::privacy::secagg
