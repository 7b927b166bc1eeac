#pragma once

// What a peer does to its update for peer-level differential privacy (TaskSpec.privacy.dp,
// docs/how-to/privacy.md): clips it to clip_norm and, with noise distributed, adds its share of
// the round's Gaussian noise, before the update is compressed and sent.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/privacy/dp_update.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::peer {

// Owned by a runner's AggregatorPeer and used on its worker thread only. Not thread-safe.
class UpdatePrivacy {
 public:
  // The privacy of `spec`'s updates: nothing without privacy.dp. The noise generator is seeded
  // from the system's CSPRNG (INTERNAL when it cannot be).
  static absl::StatusOr<UpdatePrivacy> Create(const common::v1::TaskSpec& spec);
  // The same with a seeded noise generator, for statistics checks.
  static UpdatePrivacy WithSeed(const common::v1::TaskSpec& spec, uint64_t seed);

  bool enabled() const { return dp_.has_value(); }
  // One line for the log that says what happens to updates ("" without DP).
  std::string Describe() const;

  // Clips `delta` (the whole update) to clip_norm and, with noise distributed, adds
  // N(0, (noise_multiplier x clip_norm)^2 / round_peers) to each value (round_peers: the
  // round's expected peers, RoundStarted.expected_peers; 0 is taken as 1, the full noise).
  // Returns the norm before clipping. Nothing without DP (returns 0).
  double Apply(absl::Span<float> delta, uint32_t round_peers);
  // The noise Apply adds per value for `round_peers` (as Apply takes it): 0 without DP or with
  // central noise.
  double NoiseStddev(uint32_t round_peers) const;

 private:
  UpdatePrivacy(std::optional<common::v1::DpSpec> dp, std::optional<privacy::GaussianNoise> noise)
      : dp_(std::move(dp)), noise_(std::move(noise)) {}

  std::optional<common::v1::DpSpec> dp_;
  std::optional<privacy::GaussianNoise> noise_;
};

}  // namespace shoal::peer
