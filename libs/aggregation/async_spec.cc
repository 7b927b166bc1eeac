#include "libs/aggregation/async_spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace shoal::aggregation {
namespace {

using common::v1::AsyncSpec;
using common::v1::StalenessWeighting;

StalenessWeighting EffectiveWeighting(const AsyncSpec& spec) {
  return spec.staleness() == common::v1::STALENESS_WEIGHTING_UNSPECIFIED
             ? common::v1::STALENESS_WEIGHTING_POLYNOMIAL
             : spec.staleness();
}

double EffectiveA(const AsyncSpec& spec) {
  if (spec.has_staleness_a()) return spec.staleness_a();
  return EffectiveWeighting(spec) == common::v1::STALENESS_WEIGHTING_HINGE
             ? kDefaultHingeSlope
             : kDefaultPolynomialExponent;
}

absl::Status FieldError(absl::string_view prefix, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, prefix.empty() ? "" : ".", field, ": ", what));
}

}  // namespace

void ApplyAsyncDefaults(AsyncSpec& spec, uint32_t min_participants) {
  if (!spec.has_buffer_size()) spec.set_buffer_size(min_participants);
  if (!spec.has_max_staleness()) spec.set_max_staleness(kDefaultMaxStaleness);
  if (spec.staleness() == common::v1::STALENESS_WEIGHTING_UNSPECIFIED) {
    spec.set_staleness(common::v1::STALENESS_WEIGHTING_POLYNOMIAL);
  }
  if (spec.staleness() != common::v1::STALENESS_WEIGHTING_CONSTANT && !spec.has_staleness_a()) {
    spec.set_staleness_a(EffectiveA(spec));
  }
  if (spec.staleness() == common::v1::STALENESS_WEIGHTING_HINGE && !spec.has_staleness_b()) {
    spec.set_staleness_b(kDefaultHingeOffset);
  }
}

absl::Status ValidateAsyncSpec(const AsyncSpec& spec, uint32_t max_participants,
                               absl::string_view prefix) {
  if (spec.has_buffer_size()) {
    if (spec.buffer_size() < 1) {
      return FieldError(prefix, "buffer_size", "must be >= 1, got 0");
    }
    if (max_participants != 0 && spec.buffer_size() > max_participants) {
      return FieldError(
          prefix, "buffer_size",
          absl::StrCat("must be at most max_participants (", max_participants,
                       "): the buffer holds one update per peer, got ", spec.buffer_size()));
    }
  }
  const StalenessWeighting weighting = EffectiveWeighting(spec);
  switch (weighting) {
    case common::v1::STALENESS_WEIGHTING_CONSTANT:
    case common::v1::STALENESS_WEIGHTING_POLYNOMIAL:
    case common::v1::STALENESS_WEIGHTING_HINGE:
      break;
    default:
      return FieldError(prefix, "staleness",
                        absl::StrCat("unsupported value ", static_cast<int>(weighting),
                                     " (expected constant, polynomial, hinge)"));
  }
  if (spec.has_staleness_a()) {
    if (weighting == common::v1::STALENESS_WEIGHTING_CONSTANT) {
      return FieldError(prefix, "staleness_a",
                        "used only by staleness polynomial or hinge, but staleness is constant");
    }
    if (!(spec.staleness_a() >= 0) || !std::isfinite(spec.staleness_a())) {
      return FieldError(prefix, "staleness_a",
                        absl::StrCat("must be >= 0 and finite, got ", spec.staleness_a()));
    }
  }
  if (spec.has_staleness_b() && weighting != common::v1::STALENESS_WEIGHTING_HINGE) {
    return FieldError(
        prefix, "staleness_b",
        absl::StrCat(
            "used only by staleness hinge, but staleness is ",
            weighting == common::v1::STALENESS_WEIGHTING_CONSTANT ? "constant" : "polynomial"));
  }
  return absl::OkStatus();
}

double StalenessWeight(const AsyncSpec& spec, uint64_t s) {
  const double staleness = static_cast<double>(s);
  switch (EffectiveWeighting(spec)) {
    case common::v1::STALENESS_WEIGHTING_CONSTANT:
      return 1.0;
    case common::v1::STALENESS_WEIGHTING_HINGE: {
      const uint64_t b = spec.has_staleness_b() ? spec.staleness_b() : kDefaultHingeOffset;
      if (s <= b) return 1.0;
      return 1.0 / (EffectiveA(spec) * static_cast<double>(s - b) + 1.0);
    }
    case common::v1::STALENESS_WEIGHTING_POLYNOMIAL:
    default:
      return std::pow(1.0 + staleness, -EffectiveA(spec));
  }
}

double StalenessFactor(const AsyncSpec& spec, uint64_t s) {
  return std::max(StalenessWeight(spec, s), std::numeric_limits<double>::min());
}

}  // namespace shoal::aggregation
