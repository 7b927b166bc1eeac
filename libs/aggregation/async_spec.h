#pragma once

// AsyncSpec (protos/shoal/common/v1/task.proto, mode federated-async): defaults, validation and
// the staleness weight of an update. Pure functions; thread-safe.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::aggregation {

// Defaults: polynomial weighting with a = 1 (1/(1+s)), which scripts/bench-async measured
// ahead of FedBuff's 1/sqrt(1+s) (docs/performance-history.md, "Federated-async"); the hinge
// constants are those of FedAsync's experiments (Xie et al. 2019).
inline constexpr uint32_t kDefaultMaxStaleness = 4;
inline constexpr double kDefaultPolynomialExponent = 1;
inline constexpr double kDefaultHingeSlope = 10;
inline constexpr uint32_t kDefaultHingeOffset = 4;

// Sets every unset field of `spec` to its default: buffer_size = `min_participants` (the
// buffer holds one update per peer, so this is the largest buffer the smallest allowed
// population fills), max_staleness 4, staleness polynomial, staleness_a 1 (10 for hinge),
// staleness_b 4 for hinge. Idempotent.
void ApplyAsyncDefaults(common::v1::AsyncSpec& spec, uint32_t min_participants);

// Checks `spec` (unset fields count as their defaults): buffer_size >= 1 and, when
// `max_participants` is not 0, at most max_participants; staleness_a finite and >= 0, only for
// polynomial and hinge; staleness_b only for hinge. INVALID_ARGUMENT
// "<prefix>.<field>: <what is wrong>".
absl::Status ValidateAsyncSpec(const common::v1::AsyncSpec& spec, uint32_t max_participants,
                               absl::string_view prefix = "async");

// The weight factor of an update with staleness `s` (the aggregator's version when it arrives
// minus the version it was trained from): constant 1; polynomial (1 + s)^-a; hinge 1 for
// s <= b, else 1 / (a (s - b) + 1). Unset fields take their defaults. In [0, 1], 1 at s = 0 and
// non-increasing in s. Refusing s > max_staleness is the caller's job, before weighting.
double StalenessWeight(const common::v1::AsyncSpec& spec, uint64_t s);

// StalenessWeight kept above 0 (an absurd exponent may round it down to 0): the factor
// federated-async's buffer and a federated-sync round's late updates scale a stale delta by
// before aggregating it.
double StalenessFactor(const common::v1::AsyncSpec& spec, uint64_t s);

}  // namespace shoal::aggregation
