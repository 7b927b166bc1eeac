#pragma once

// Peer-level differential privacy in a decentralized round (privacy.dp at level peer), at one
// participant: nobody aggregates for the participants, so each adds the noise to what it serves
// itself (docs/how-to/privacy.md). A clear round's update (trained − base) is clipped to
// clip_norm and gets N(0, (noise_multiplier · clip_norm)²) per value: every other participant
// sees it. A secure round's update (SecureRound) is clipped and gets the noise for a masking among
// n participants: with noise distributed a share, N(0, (noise_multiplier · clip_norm)² / n), the
// masks reveal only the sum of the n shares; with noise central the full noise again.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/privacy/dp_update.h"
#include "libs/tensor/flat_model.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::peer {

// Owned by a DecentralizedRunner and used on its worker thread only. Not thread-safe.
class ServedNoise {
 public:
  // The noise of `spec`'s served updates: none without privacy.dp at level peer. The generator
  // is seeded from the system's CSPRNG (INTERNAL when it cannot be).
  static absl::StatusOr<ServedNoise> Create(const common::v1::TaskSpec& spec);
  // The same with a seeded generator, for statistics checks.
  static ServedNoise WithSeed(const common::v1::TaskSpec& spec, uint64_t seed);

  // Whether served updates are clipped and noised (privacy.dp at level peer).
  bool enabled() const { return noise_.has_value(); }
  double clip_norm() const { return clip_norm_; }
  // The noise per value of an update masked among `participants` (0 is taken as 1): the share
  // with noise distributed, else the full noise. 0 when not enabled.
  double StddevFor(size_t participants) const;

  // A clear round: makes `trained` base + clip(trained − base) + N(0, StddevFor(1)²) per value.
  // Returns the update's norm before clipping (0 when not enabled: nothing changes).
  // INVALID_ARGUMENT when the layouts differ or a value is not finite (nothing changes).
  absl::StatusOr<double> ApplyToModel(const tensor::FlatModel& base, tensor::FlatModel& trained);
  // A secure round: clips `delta` to clip_norm and adds N(0, StddevFor(participants)²) per
  // value. Returns the norm before clipping (0 when not enabled: nothing changes).
  double ApplyToDelta(absl::Span<float> delta, size_t participants);

 private:
  ServedNoise(double noise_multiplier, double clip_norm, bool distributed,
              std::optional<privacy::GaussianNoise> noise)
      : noise_multiplier_(noise_multiplier),
        clip_norm_(clip_norm),
        distributed_(distributed),
        noise_(std::move(noise)) {}

  double noise_multiplier_ = 0;
  double clip_norm_ = 0;
  bool distributed_ = false;
  std::optional<privacy::GaussianNoise> noise_;  // set when enabled
};

}  // namespace shoal::peer
