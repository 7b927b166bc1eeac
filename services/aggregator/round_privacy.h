#pragma once

// Peer-level differential privacy in an aggregator's round (OpenRoundRequest.dp, DP-FedAvg):
// which rounds may take it, what happens to each update on arrival, and the noise and fixed
// denominator added before the round publishes. See docs/how-to/privacy.md.
//
// Why a fixed denominator: the accountant bounds what one peer changes, its clipped update of
// norm <= clip_norm in the sum. Weighting updates by their sample counts would let one peer
// weigh more than clip_norm (and the counts are private too); dividing by the number of updates
// that actually arrived would make the divisor itself depend on whether a peer took part. So
// every update weighs 1 and the round divides the noisy sum by the number of peers expected
// when it opened, a public number: base + (sum of clipped updates + noise) / n.

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/aggregator/core_types.h"
#include "services/aggregator/round_aggregation.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::aggregator {

// Whether `dp` asks for DP (level peer).
inline bool HasDp(const common::v1::DpSpec& dp) { return dp.level() == common::v1::DP_LEVEL_PEER; }

// The rounds that may take DP: mean in float32, no late peers or replicas, with clip_norm > 0,
// noise_multiplier >= 0 and noise central (or unspecified: central) or distributed; with
// expected peers, or dp_round_peers (required on a tree: children or a parent) of at least them.
// INVALID_ARGUMENT naming the conflict, prefixed with `label`.
absl::Status CheckRoundDp(const OpenRoundParams& params, absl::string_view label);

// The peers expected in the whole round, the fixed denominator: dp_round_peers on a tree,
// len(expected_peers) on a flat round.
size_t DpRoundPeers(const OpenRoundParams& params);

// Tree rounds: whether a child's partial sum of `count` updates with total weight
// `total_weight` may enter a round with DP: every update weighs 1 (INVALID_ARGUMENT otherwise,
// prefixed with `label`).
absl::Status CheckDpPartial(size_t count, double total_weight, absl::string_view label);

// What the round does to an update when it arrives, before folding it with weight 1: with
// central noise it is clipped to clip_norm again (quantised compression may round it a hair
// over the bound, and a peer may not have clipped at all). With distributed noise it is left
// as is: it already carries the peer's share of the noise, which clipping would cut.
void PrivatizeArrival(const common::v1::DpSpec& dp, absl::Span<float> update);

// The noise the aggregator adds per value to a sum of `updates` of the `expected` peers' updates,
// so that the sum carries N(0, (noise_multiplier x clip_norm)^2), what the accountant charges:
// all of it with central noise; with distributed noise the shares of the peers whose updates are
// missing, noise_multiplier x clip_norm x sqrt((expected - updates) / expected) (0 when all came).
double MissingNoiseStddev(const common::v1::DpSpec& dp, size_t expected, size_t updates);

// Before the round applies: adds the noise (MissingNoiseStddev per value, from a generator
// seeded by the system's CSPRNG) and the weight that makes the divisor `expected` (the peers
// expected at the open) for `updates` folded updates (>= 1).
// Errors: INTERNAL without system entropy, INVALID_ARGUMENT from the aggregation.
absl::Status AddRoundNoise(const common::v1::DpSpec& dp, size_t expected, size_t updates,
                           size_t values, RoundAggregation& aggregation);

// What a secure round with peer-level DP publishes from the decoded ring sum `sum` of `updates`
// of the `expected` peers' updates: base + (sum + N(0, MissingNoiseStddev²)) / expected, the
// same fixed-denominator mean as a plain round. Errors: INTERNAL without system entropy,
// INVALID_ARGUMENT when the lengths differ.
absl::StatusOr<std::vector<float>> PrivateMeanOfSum(const common::v1::DpSpec& dp,
                                                    absl::Span<const double> sum, size_t updates,
                                                    size_t expected, absl::Span<const float> base);

}  // namespace shoal::aggregator
