#pragma once

// dpwa's interpolation: how much of a fetched peer model a peer takes, and the mixing itself.
// Pure functions; no gRPC, no LibTorch.

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/gossip/gossip_spec.h"

namespace shoal::gossip {

// The state a peer publishes with its parameters.
struct PeerState {
  double clock = 0;  // training steps, interpolated with the same factor as the parameters
  double loss = 0;   // recent training loss
};

// The interpolation factor f in [0, 1] for mixing `peer` into `local`:
//   constant: f = constant_factor
//   clock:    f = peer.clock / (local.clock + peer.clock)   (0/0 -> 0.5)
//   loss:     f = local.loss / (local.loss + peer.loss)     (0/0 -> 0.5): the worse the local
//             model, the more it takes
// then, if divergence_threshold > 0 and local.loss < divergence_threshold,
//   f *= local.loss / divergence_threshold.
// Errors: INVALID_ARGUMENT when a clock or loss is negative or not finite (a peer's state is
// untrusted input).
absl::StatusOr<double> InterpolationFactor(const GossipConfig& config, const PeerState& local,
                                           const PeerState& peer);

// The clock after mixing: f * peer_clock + (1 - f) * clock.
double InterpolateClock(double f, double clock, double peer_clock);

// dpwa's mix, in place: local[i] = f * peer[i] + (1 - f) * local[i].
// Errors: INVALID_ARGUMENT on a size mismatch or f outside [0, 1].
absl::Status Interpolate(double f, absl::Span<const float> peer, absl::Span<float> local);

// Shoal's default mix (see GossipSpec.mix_post_step): the peer's snapshot is mixed with the
// weights the fetch started from (`before`, this peer's published snapshot) and this step's
// update is kept whole: local[i] += f * (peer[i] - before[i]), i.e.
// f * peer + (1 - f) * before + (after - before).
// Errors: INVALID_ARGUMENT on a size mismatch or f outside [0, 1].
absl::Status InterpolateKeepingStep(double f, absl::Span<const float> peer,
                                    absl::Span<const float> before, absl::Span<float> local);

// True when every value is finite.
bool AllFinite(absl::Span<const float> values);

// sqrt(mean_i ||x_i - x̄||²) over models of equal size (x̄ = their element-wise mean); 0 for fewer
// than two. Errors: INVALID_ARGUMENT on a size mismatch.
absl::StatusOr<double> ConsensusDistance(const std::vector<absl::Span<const float>>& models);

// Element-wise mean of models of equal size. Errors: INVALID_ARGUMENT empty or size mismatch.
absl::StatusOr<std::vector<float>> MeanModel(const std::vector<absl::Span<const float>>& models);

}  // namespace shoal::gossip
