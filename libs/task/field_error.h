#pragma once

// The error every task-file rule returns: INVALID_ARGUMENT that starts with the field's path.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shoal::task {

// "<field>: <what>", e.g. FieldError("rounds", "must be at least 1").
inline absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

}  // namespace shoal::task
