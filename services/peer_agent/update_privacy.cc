#include "services/peer_agent/update_privacy.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/task/task_privacy.h"

namespace shoal::peer {

absl::StatusOr<UpdatePrivacy> UpdatePrivacy::Create(const common::v1::TaskSpec& spec,
                                                    CentralNoise central) {
  if (!task::HasPeerDp(spec)) return UpdatePrivacy(std::nullopt, central, std::nullopt);
  absl::StatusOr<privacy::GaussianNoise> noise = privacy::GaussianNoise::FromSystemEntropy();
  if (!noise.ok()) return noise.status();
  return UpdatePrivacy(spec.privacy().dp(), central, *std::move(noise));
}

UpdatePrivacy UpdatePrivacy::WithSeed(const common::v1::TaskSpec& spec, CentralNoise central,
                                      uint64_t seed) {
  if (!task::HasPeerDp(spec)) return UpdatePrivacy(std::nullopt, central, std::nullopt);
  return UpdatePrivacy(spec.privacy().dp(), central, privacy::GaussianNoise::FromSeed(seed));
}

std::string UpdatePrivacy::Describe() const {
  if (!dp_) return "";
  if (central_ == CentralNoise::kAtPeer) {
    return absl::StrCat("clipped to L2 norm ", dp_->clip_norm(), " and carry noise of stddev ",
                        NoiseStddev(1));
  }
  const bool distributed = dp_->noise() == common::v1::DP_NOISE_DISTRIBUTED;
  return absl::StrCat("clipped to L2 norm ", dp_->clip_norm(),
                      distributed ? absl::StrCat(", with this peer's share of noise multiplier ",
                                                 dp_->noise_multiplier(), " (distributed)")
                                  : ", the aggregator adds the noise (central)");
}

double UpdatePrivacy::NoiseStddev(uint32_t summed) const {
  if (!dp_) return 0;
  if (dp_->noise() == common::v1::DP_NOISE_DISTRIBUTED) {
    return privacy::DistributedNoiseStddev(dp_->noise_multiplier(), dp_->clip_norm(), summed);
  }
  return central_ == CentralNoise::kAtPeer ? dp_->noise_multiplier() * dp_->clip_norm() : 0;
}

double UpdatePrivacy::Apply(absl::Span<float> delta, uint32_t summed) {
  if (!dp_) return 0;
  const double norm = privacy::ClipToNorm(delta, dp_->clip_norm());
  if (const double stddev = NoiseStddev(summed); stddev > 0) noise_->Add(delta, stddev);
  return norm;
}

absl::StatusOr<double> UpdatePrivacy::ApplyToModel(const tensor::FlatModel& base,
                                                   tensor::FlatModel& trained) {
  if (!dp_) return 0.0;
  if (!(base.layout == trained.layout) || base.values.size() != trained.values.size()) {
    return absl::InvalidArgumentError(
        "update privacy: the trained model's layout is not the base's");
  }
  std::vector<float> delta(trained.values.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = trained.values[i] - base.values[i];
  const double norm = privacy::L2Norm(delta);
  if (!std::isfinite(norm)) {
    return absl::InvalidArgumentError(
        "update privacy: the round update has a value that is not finite");
  }
  Apply(absl::MakeSpan(delta), 1);  // served on its own: nobody else's noise is summed with it
  for (size_t i = 0; i < delta.size(); ++i) trained.values[i] = base.values[i] + delta[i];
  return norm;
}

}  // namespace shoal::peer
