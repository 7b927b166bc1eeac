#pragma once

// What a peer does to its update for peer-level differential privacy (TaskSpec.privacy.dp at
// level peer, docs/how-to/privacy.md), in every mode that has one: clips it to clip_norm and
// adds Gaussian noise, before the update is compressed, masked or served.
// - noise distributed: each update carries a share N(0, (noise_multiplier · clip_norm)² / n) of
//   the noise, where n updates are summed (an aggregator's round, a secure decentralized round's
//   masking), so the sum carries the full noise;
// - noise central: where an aggregator adds the noise to the sum (federated modes) the peer only
//   clips; where nobody aggregates (a decentralized participant serves its own update) the peer
//   adds the full noise itself.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/privacy/dp_update.h"
#include "libs/tensor/flat_model.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::peer {

// Who adds the noise of `noise: central`.
enum class CentralNoise {
  kAtAggregator,  // an aggregator adds it to the sum: the peer only clips
  kAtPeer,        // nobody aggregates: the peer adds the full noise to what it serves
};

// Owned by one runner and used on its worker thread only. Not thread-safe.
class UpdatePrivacy {
 public:
  // The privacy of `spec`'s updates: nothing without privacy.dp at level peer. The noise
  // generator is seeded from the system's CSPRNG (INTERNAL when it cannot be).
  static absl::StatusOr<UpdatePrivacy> Create(const common::v1::TaskSpec& spec,
                                              CentralNoise central);
  // The same with a seeded noise generator, for statistics checks.
  static UpdatePrivacy WithSeed(const common::v1::TaskSpec& spec, CentralNoise central,
                                uint64_t seed);

  bool enabled() const { return dp_.has_value(); }
  // What happens to updates, for the log ("" without DP): with the noise at the peer, the clip
  // norm and the noise per value of an update served on its own (NoiseStddev(1)).
  std::string Describe() const;

  // The noise Apply adds per value when `summed` updates are summed (0 is taken as 1: the full
  // noise); 0 without DP or with the aggregator adding central noise.
  double NoiseStddev(uint32_t summed) const;
  // Clips `delta` (the whole update) to clip_norm and adds N(0, NoiseStddev(summed)²) to each
  // value. Returns the norm before clipping. Nothing without DP (returns 0).
  double Apply(absl::Span<float> delta, uint32_t summed);
  // An update served on its own (a clear decentralized round): makes `trained`
  // base + clip(trained − base) + N(0, NoiseStddev(1)²) per value. Returns the update's norm
  // before clipping (0 without DP: nothing changes). INVALID_ARGUMENT when the layouts differ or
  // a value is not finite (nothing changes).
  absl::StatusOr<double> ApplyToModel(const tensor::FlatModel& base, tensor::FlatModel& trained);

 private:
  UpdatePrivacy(std::optional<common::v1::DpSpec> dp, CentralNoise central,
                std::optional<privacy::GaussianNoise> noise)
      : dp_(std::move(dp)), central_(central), noise_(std::move(noise)) {}

  std::optional<common::v1::DpSpec> dp_;
  CentralNoise central_;
  std::optional<privacy::GaussianNoise> noise_;  // set when enabled
};

}  // namespace shoal::peer
