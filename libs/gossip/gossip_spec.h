#pragma once

// GossipSpec (protos/shoal/common/v1/task.proto) defaults, validation and the resolved settings
// the gossip runner works with. No gRPC, no LibTorch.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::gossip {

// dpwa's defaults (its sample configuration and flow-control constants). divergence_threshold
// defaults to 0 (off): dpwa's sample sets 0.2, but its documentation calls 0 "disabled" and a
// positive value changes the algorithm, so it is opt-in.
inline constexpr double kDefaultFetchProbability = 1.0;
inline constexpr uint32_t kDefaultTimeoutMs = 2500;
inline constexpr double kDefaultConstantFactor = 0.5;
inline constexpr double kDefaultDivergenceThreshold = 0.0;
inline constexpr double kDefaultScoreInitial = 1000;
inline constexpr double kDefaultScoreMin = 10;
inline constexpr double kDefaultScoreMax = 1000;
inline constexpr double kDefaultSuccessBonus = 10;
inline constexpr double kDefaultFailurePenalty = 100;
inline constexpr double kDefaultRandomMin = 10;
inline constexpr double kDefaultRandomMax = 1000;

// Sets every unset field of `spec` to its default (interpolation constant, constant_factor 0.5,
// fetch_probability 1, timeout_ms 2500, divergence_threshold 0, the flow-control constants), so
// that a stored or shown task carries its effective settings. Idempotent.
void ApplyGossipDefaults(common::v1::GossipSpec& spec);

// Checks `spec` (unset fields count as their defaults). Errors are INVALID_ARGUMENT
// "<prefix>.<field>: <what is wrong>", e.g. "gossip.fetch_probability: must be in [0, 1], got 2".
absl::Status ValidateGossipSpec(const common::v1::GossipSpec& spec,
                                absl::string_view prefix = "gossip");

// Flow-control constants (see FlowControlSpec) plus Shoal's demotion backoff.
struct FlowControlOptions {
  double initial = kDefaultScoreInitial;
  double min = kDefaultScoreMin;
  double max = kDefaultScoreMax;
  double success_bonus = kDefaultSuccessBonus;
  double failure_penalty = kDefaultFailurePenalty;
  double random_min = kDefaultRandomMin;
  double random_max = kDefaultRandomMax;
  // A peer that fails (timeout, refused, bad snapshot) is not asked again before a backoff that
  // doubles with each consecutive failure, from demote_initial up to demote_max. When the
  // backoff expires it gets one probe; a successful probe re-admits it with at least
  // `readmit_score` (default: `initial`), so an erroring peer is never evicted for good.
  absl::Duration demote_initial = absl::Seconds(1);
  absl::Duration demote_max = absl::Seconds(10);
  double readmit_score = kDefaultScoreInitial;
  // A peer that answers "no snapshot yet" is skipped for this long (not a failure).
  absl::Duration no_state_delay = absl::Milliseconds(200);

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// The effective settings of a gossip task (defaults applied).
struct GossipConfig {
  double fetch_probability = kDefaultFetchProbability;
  absl::Duration timeout = absl::Milliseconds(kDefaultTimeoutMs);
  common::v1::Interpolation interpolation = common::v1::INTERPOLATION_CONSTANT;
  double constant_factor = kDefaultConstantFactor;
  double divergence_threshold = kDefaultDivergenceThreshold;
  bool include_buffers = false;
  bool mix_post_step = false;
  FlowControlOptions flow_control;
};

// `spec` with defaults applied. Call ValidateGossipSpec first.
GossipConfig ResolveGossipSpec(const common::v1::GossipSpec& spec);

}  // namespace shoal::gossip
