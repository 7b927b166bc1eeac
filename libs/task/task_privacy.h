#pragma once

// The privacy section of a task (protos/shoal/common/v1/task.proto, PrivacySpec): differential
// privacy at the peer level (DP-FedAvg: clipped updates and Gaussian noise on their sum, added by
// the aggregator or, in a decentralized task, by each participant before it serves its update)
// or the sample level (DP-SGD: each peer's optimizer step). The modes' definitions
// (task_mode.h, ModeSections) say which levels each takes.

#include "absl/status/status.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::task {

// Whether the task asks for differential privacy (privacy.dp present).
inline bool HasDp(const common::v1::TaskSpec& spec) {
  return spec.has_privacy() && spec.privacy().has_dp();
}

// privacy.dp at level peer: the update is clipped and the round's sum gets the noise.
inline bool HasPeerDp(const common::v1::TaskSpec& spec) {
  return HasDp(spec) && spec.privacy().dp().level() == common::v1::DP_LEVEL_PEER;
}

// privacy.dp at level sample: each peer trains with DP-SGD.
inline bool HasSampleDp(const common::v1::TaskSpec& spec) {
  return HasDp(spec) && spec.privacy().dp().level() == common::v1::DP_LEVEL_SAMPLE;
}

// privacy.dp at level peer with noise distributed: each peer adds its share of the noise the sum
// of the round's updates needs.
inline bool HasDistributedNoise(const common::v1::TaskSpec& spec) {
  return HasPeerDp(spec) && spec.privacy().dp().noise() == common::v1::DP_NOISE_DISTRIBUTED;
}

// Whether the task asks for secure aggregation (privacy.secure_aggregation present).
inline bool HasSecureAggregation(const common::v1::TaskSpec& spec) {
  return spec.has_privacy() && spec.privacy().has_secure_aggregation();
}

// The L2 norm a secure round's updates are clipped to: privacy.secure_aggregation.clip_norm, or
// with privacy.dp at level peer and that left out (0), privacy.dp.clip_norm.
double SecureClipNorm(const common::v1::TaskSpec& spec);

// The bound on |x| of every feature value that sizes the encoding of the peers' masked moments
// for the federation's statistics under secure aggregation: privacy.secure_aggregation
// .feature_bound, or for an image folder without one 1 (pixels scaled to [0, 1]); 0 when the
// task has none (csv without feature_bound, which validation refuses).
double StatisticsFeatureBound(const common::v1::TaskSpec& spec);

// Checks privacy.dp and privacy.secure_aggregation. INVALID_ARGUMENT "<field>: <what>", e.g.
// "privacy.dp.clip_norm: must be > 0, got 0". privacy.dp refuses, each with a message naming
// why: level unset; a level the mode's definition does not take (its dp_peer_refusal says why);
// noise distributed where the peers add the noise (dp_noise_at_peers) without secure
// aggregation; a hierarchical topology and stragglers (not supported yet with DP). Level peer also
// refuses compression topk and aggregation_options.exact_sum (not supported yet), any aggregation
// but mean (the noise is calibrated to the sum of clipped updates, the sensitivity of a mean and of
// no robust strategy) and a target_epsilon that one round with every peer taking part already
// exceeds. Level sample refuses `noise` (each peer's step adds the noise) and takes any strategy
// and compression: they only post-process updates that are already private.
// privacy.secure_aggregation: clip_norm > 0 (with dp at level peer: left out, or equal to
// privacy.dp.clip_norm); threshold and neighbourhood_size 0 or >= 2, and a
// threshold that every round's neighbourhood (at most neighbourhood_size, max_participants - 1)
// can hold (decentralized: both 0, every participant masks with every other one); refused,
// naming why: any mode but federated-sync and decentralized; min_participants below 3; an
// aggregation that must see each update (median, trimmed-mean, krum, multi-krum,
// centered-clipping); stragglers, compression and max_update_norm (not supported with it); on a
// hierarchical topology, cluster_size below 3, replicas above 1, a non-zero threshold and
// exact_sum. It combines with privacy.dp at either level. Part of ValidateTaskSpec.
absl::Status ValidatePrivacy(const common::v1::TaskSpec& spec);

// When privacy.dp is at level peer and its noise unset: noise distributed with secure
// aggregation (every update leaves its peer with its share of the noise), else central.
void ApplyPrivacyDefaults(common::v1::TaskSpec& spec);

}  // namespace shoal::task
