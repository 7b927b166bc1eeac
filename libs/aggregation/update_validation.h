#pragma once

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "libs/tensor/flat_model.h"

namespace shoal::aggregation {

// Checks on an update before it may be aggregated. Errors are INVALID_ARGUMENT with a message
// that names the tensor or the bound. Pure functions; thread-safe.

// Every value finite; names the first tensor and element that is not.
absl::Status CheckFinite(const tensor::FlatModel& update);

// L2 norm over all values (accumulated in double).
double L2Norm(absl::Span<const float> values);
// Writes `x` - `base` (float subtraction, element by element) into `out` and returns its L2Norm,
// bit for bit, in one pass instead of two. The three spans have one size.
double DifferenceL2Norm(absl::Span<const float> x, absl::Span<const float> base,
                        absl::Span<float> out);

// `norm` <= `max_norm`; max_norm <= 0 means no bound.
absl::Status CheckNormBound(double norm, double max_norm);

// `update` has exactly `expected` (names, shapes, order) and the matching number of values.
absl::Status CheckLayout(const tensor::FlatModel& update, const tensor::ModelLayout& expected);

}  // namespace shoal::aggregation
