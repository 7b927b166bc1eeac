#include "libs/privacy/dp_update.h"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shoal::privacy {

double L2Norm(absl::Span<const float> values) {
  double sum = 0;
  for (float v : values) sum += static_cast<double>(v) * static_cast<double>(v);
  return std::sqrt(sum);
}

double ClipToNorm(absl::Span<float> values, double clip_norm) {
  const double norm = L2Norm(values);
  if (!std::isfinite(norm) || norm <= clip_norm) return norm;
  const float scale = static_cast<float>(clip_norm / norm);
  for (float& v : values) v *= scale;
  // float rounding may leave the product a hair above clip_norm; shrink once more if so, so the
  // bound the accountant relies on holds exactly.
  const double after = L2Norm(values);
  if (after > clip_norm) {
    const float again = std::nextafter(static_cast<float>(clip_norm / after), 0.0F);
    for (float& v : values) v *= again;
  }
  return norm;
}

absl::StatusOr<std::mt19937_64> EngineFromSystemEntropy(absl::string_view what) {
  std::array<unsigned char, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return absl::InternalError(absl::StrCat("RAND_bytes failed: no system entropy for ", what));
  }
  std::array<uint32_t, 8> words{};
  std::memcpy(words.data(), bytes.data(), bytes.size());
  std::seed_seq seq(words.begin(), words.end());
  return std::mt19937_64(seq);
}

absl::StatusOr<GaussianNoise> GaussianNoise::FromSystemEntropy() {
  absl::StatusOr<std::mt19937_64> engine = EngineFromSystemEntropy("the DP noise");
  if (!engine.ok()) return engine.status();
  return GaussianNoise(*engine);
}

GaussianNoise GaussianNoise::FromSeed(uint64_t seed) {
  return GaussianNoise(std::mt19937_64(seed));
}

void GaussianNoise::Add(absl::Span<float> values, double stddev) {
  if (!(stddev > 0)) return;
  std::normal_distribution<double> normal(0.0, stddev);
  for (float& v : values) v = static_cast<float>(static_cast<double>(v) + normal(engine_));
}

double DistributedNoiseStddev(double noise_multiplier, double clip_norm, uint32_t peers) {
  return noise_multiplier * clip_norm /
         std::sqrt(static_cast<double>(std::max<uint32_t>(peers, 1)));
}

}  // namespace shoal::privacy
