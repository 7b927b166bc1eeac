#include "libs/gossip/gossip_spec.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::gossip {
namespace {

using common::v1::FlowControlSpec;
using common::v1::GossipSpec;

std::string Num(double v) { return absl::StrFormat("%g", v); }

absl::Status FieldError(absl::string_view prefix, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, prefix.empty() ? "" : ".", field, ": ", what));
}

FlowControlOptions ResolveFlowControl(const FlowControlSpec& s) {
  FlowControlOptions o;
  if (s.has_initial()) o.initial = s.initial();
  if (s.has_min()) o.min = s.min();
  if (s.has_max()) o.max = s.max();
  if (s.has_success_bonus()) o.success_bonus = s.success_bonus();
  if (s.has_failure_penalty()) o.failure_penalty = s.failure_penalty();
  if (s.has_random_min()) o.random_min = s.random_min();
  if (s.has_random_max()) o.random_max = s.random_max();
  o.readmit_score = o.initial;
  return o;
}

}  // namespace

void ApplyGossipDefaults(GossipSpec& spec) {
  if (!spec.has_fetch_probability()) spec.set_fetch_probability(kDefaultFetchProbability);
  if (!spec.has_timeout_ms()) spec.set_timeout_ms(kDefaultTimeoutMs);
  if (spec.interpolation() == common::v1::INTERPOLATION_UNSPECIFIED) {
    spec.set_interpolation(common::v1::INTERPOLATION_CONSTANT);
  }
  if (spec.interpolation() == common::v1::INTERPOLATION_CONSTANT && !spec.has_constant_factor()) {
    spec.set_constant_factor(kDefaultConstantFactor);
  }
  if (!spec.has_divergence_threshold()) {
    spec.set_divergence_threshold(kDefaultDivergenceThreshold);
  }
  FlowControlSpec& fc = *spec.mutable_flow_control();
  if (!fc.has_initial()) fc.set_initial(kDefaultScoreInitial);
  if (!fc.has_min()) fc.set_min(kDefaultScoreMin);
  if (!fc.has_max()) fc.set_max(kDefaultScoreMax);
  if (!fc.has_success_bonus()) fc.set_success_bonus(kDefaultSuccessBonus);
  if (!fc.has_failure_penalty()) fc.set_failure_penalty(kDefaultFailurePenalty);
  if (!fc.has_random_min()) fc.set_random_min(kDefaultRandomMin);
  if (!fc.has_random_max()) fc.set_random_max(kDefaultRandomMax);
}

absl::Status FlowControlOptions::Validate() const {
  const std::pair<const char*, double> finite[] = {{"initial", initial},
                                                   {"min", min},
                                                   {"max", max},
                                                   {"success_bonus", success_bonus},
                                                   {"failure_penalty", failure_penalty},
                                                   {"random_min", random_min},
                                                   {"random_max", random_max},
                                                   {"readmit_score", readmit_score}};
  for (const auto& [name, v] : finite) {
    if (!std::isfinite(v))
      return FieldError("", name, absl::StrCat("must be finite, got ", Num(v)));
  }
  if (min > max) {
    return FieldError("", "min", absl::StrCat("must be <= max (", Num(max), "), got ", Num(min)));
  }
  if (initial < min || initial > max) {
    return FieldError("", "initial",
                      absl::StrCat("must be in [min, max] = [", Num(min), ", ", Num(max), "], got ",
                                   Num(initial)));
  }
  if (success_bonus < 0) {
    return FieldError("", "success_bonus", absl::StrCat("must be >= 0, got ", Num(success_bonus)));
  }
  if (failure_penalty < 0) {
    return FieldError("", "failure_penalty",
                      absl::StrCat("must be >= 0, got ", Num(failure_penalty)));
  }
  if (random_min > random_max) {
    return FieldError(
        "", "random_min",
        absl::StrCat("must be <= random_max (", Num(random_max), "), got ", Num(random_min)));
  }
  if (demote_initial < absl::ZeroDuration() || demote_max < demote_initial) {
    return FieldError("", "demote_initial", "must be in [0, demote_max]");
  }
  if (no_state_delay < absl::ZeroDuration()) {
    return FieldError("", "no_state_delay", "must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateGossipSpec(const GossipSpec& spec, absl::string_view prefix) {
  if (spec.has_fetch_probability()) {
    const double p = spec.fetch_probability();
    if (!(p >= 0 && p <= 1)) {
      return FieldError(prefix, "fetch_probability",
                        absl::StrCat("must be in [0, 1], got ", Num(p)));
    }
  }
  if (spec.has_timeout_ms() && (spec.timeout_ms() < 1 || spec.timeout_ms() > 600000)) {
    return FieldError(prefix, "timeout_ms",
                      absl::StrCat("must be in 1..600000, got ", spec.timeout_ms()));
  }
  switch (spec.interpolation()) {
    case common::v1::INTERPOLATION_UNSPECIFIED:
    case common::v1::INTERPOLATION_CONSTANT:
    case common::v1::INTERPOLATION_CLOCK:
    case common::v1::INTERPOLATION_LOSS:
      break;
    default:
      return FieldError(prefix, "interpolation",
                        absl::StrCat("unsupported value ", static_cast<int>(spec.interpolation()),
                                     " (expected constant, clock, loss)"));
  }
  if (spec.has_constant_factor()) {
    const double f = spec.constant_factor();
    if (!(f >= 0 && f <= 1)) {
      return FieldError(prefix, "constant_factor", absl::StrCat("must be in [0, 1], got ", Num(f)));
    }
  }
  if (spec.has_divergence_threshold()) {
    const double t = spec.divergence_threshold();
    if (!(t >= 0) || !std::isfinite(t)) {
      return FieldError(prefix, "divergence_threshold",
                        absl::StrCat("must be >= 0 (0 = off), got ", Num(t)));
    }
  }
  absl::Status fc = ResolveFlowControl(spec.flow_control()).Validate();
  if (!fc.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, prefix.empty() ? "" : ".", "flow_control.", fc.message()));
  }
  return absl::OkStatus();
}

GossipConfig ResolveGossipSpec(const GossipSpec& spec) {
  GossipConfig c;
  if (spec.has_fetch_probability()) c.fetch_probability = spec.fetch_probability();
  if (spec.has_timeout_ms()) c.timeout = absl::Milliseconds(spec.timeout_ms());
  if (spec.interpolation() != common::v1::INTERPOLATION_UNSPECIFIED) {
    c.interpolation = spec.interpolation();
  }
  if (spec.has_constant_factor()) c.constant_factor = spec.constant_factor();
  if (spec.has_divergence_threshold()) c.divergence_threshold = spec.divergence_threshold();
  c.include_buffers = spec.include_buffers();
  c.mix_post_step = spec.mix_post_step();
  c.flow_control = ResolveFlowControl(spec.flow_control());
  return c;
}

}  // namespace shoal::gossip
