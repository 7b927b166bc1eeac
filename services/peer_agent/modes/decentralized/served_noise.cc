#include "services/peer_agent/modes/decentralized/served_noise.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/task/task_privacy.h"

namespace shoal::peer {
namespace {

bool Distributed(const common::v1::TaskSpec& spec) {
  return spec.privacy().dp().noise() == common::v1::DP_NOISE_DISTRIBUTED;
}

}  // namespace

absl::StatusOr<ServedNoise> ServedNoise::Create(const common::v1::TaskSpec& spec) {
  if (!task::HasPeerDp(spec)) return ServedNoise(0, 0, false, std::nullopt);
  absl::StatusOr<privacy::GaussianNoise> noise = privacy::GaussianNoise::FromSystemEntropy();
  if (!noise.ok()) return noise.status();
  const common::v1::DpSpec& dp = spec.privacy().dp();
  return ServedNoise(dp.noise_multiplier(), dp.clip_norm(), Distributed(spec), *std::move(noise));
}

ServedNoise ServedNoise::WithSeed(const common::v1::TaskSpec& spec, uint64_t seed) {
  if (!task::HasPeerDp(spec)) return ServedNoise(0, 0, false, std::nullopt);
  const common::v1::DpSpec& dp = spec.privacy().dp();
  return ServedNoise(dp.noise_multiplier(), dp.clip_norm(), Distributed(spec),
                     privacy::GaussianNoise::FromSeed(seed));
}

double ServedNoise::StddevFor(size_t participants) const {
  if (!enabled()) return 0;
  if (!distributed_) return noise_multiplier_ * clip_norm_;
  return privacy::DistributedNoiseStddev(
      noise_multiplier_, clip_norm_, static_cast<uint32_t>(participants == 0 ? 1 : participants));
}

absl::StatusOr<double> ServedNoise::ApplyToModel(const tensor::FlatModel& base,
                                                 tensor::FlatModel& trained) {
  if (!enabled()) return 0.0;
  if (!(base.layout == trained.layout) || base.values.size() != trained.values.size()) {
    return absl::InvalidArgumentError("served noise: the trained model's layout is not the base's");
  }
  std::vector<float> delta(trained.values.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = trained.values[i] - base.values[i];
  const double norm = privacy::L2Norm(delta);
  if (!std::isfinite(norm)) {
    return absl::InvalidArgumentError(
        "served noise: the round update has a value that is not finite");
  }
  // Clear rounds have no masking: every other participant sees this update on its own.
  ApplyToDelta(absl::MakeSpan(delta), 1);
  for (size_t i = 0; i < delta.size(); ++i) trained.values[i] = base.values[i] + delta[i];
  return norm;
}

double ServedNoise::ApplyToDelta(absl::Span<float> delta, size_t participants) {
  if (!enabled()) return 0;
  const double norm = privacy::ClipToNorm(delta, clip_norm_);
  if (const double stddev = StddevFor(participants); stddev > 0) noise_->Add(delta, stddev);
  return norm;
}

}  // namespace shoal::peer
