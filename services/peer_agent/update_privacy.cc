#include "services/peer_agent/update_privacy.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/task/task_privacy.h"

namespace shoal::peer {

absl::StatusOr<UpdatePrivacy> UpdatePrivacy::Create(const common::v1::TaskSpec& spec) {
  if (!task::HasPeerDp(spec)) return UpdatePrivacy(std::nullopt, std::nullopt);
  absl::StatusOr<privacy::GaussianNoise> noise = privacy::GaussianNoise::FromSystemEntropy();
  if (!noise.ok()) return noise.status();
  return UpdatePrivacy(spec.privacy().dp(), *std::move(noise));
}

UpdatePrivacy UpdatePrivacy::WithSeed(const common::v1::TaskSpec& spec, uint64_t seed) {
  if (!task::HasPeerDp(spec)) return UpdatePrivacy(std::nullopt, std::nullopt);
  return UpdatePrivacy(spec.privacy().dp(), privacy::GaussianNoise::FromSeed(seed));
}

std::string UpdatePrivacy::Describe() const {
  if (!dp_) return "";
  const bool distributed = dp_->noise() == common::v1::DP_NOISE_DISTRIBUTED;
  return absl::StrCat("clipped to L2 norm ", dp_->clip_norm(),
                      distributed ? absl::StrCat(", with this peer's share of noise multiplier ",
                                                 dp_->noise_multiplier(), " (distributed)")
                                  : ", the aggregator adds the noise (central)");
}

double UpdatePrivacy::NoiseStddev(uint32_t round_peers) const {
  if (!dp_ || dp_->noise() != common::v1::DP_NOISE_DISTRIBUTED) return 0;
  return privacy::DistributedNoiseStddev(dp_->noise_multiplier(), dp_->clip_norm(), round_peers);
}

double UpdatePrivacy::Apply(absl::Span<float> delta, uint32_t round_peers) {
  if (!dp_) return 0;
  const double norm = privacy::ClipToNorm(delta, dp_->clip_norm());
  if (const double stddev = NoiseStddev(round_peers); stddev > 0) noise_->Add(delta, stddev);
  return norm;
}

}  // namespace shoal::peer
