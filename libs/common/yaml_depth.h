#pragma once

// A nesting-depth cap for YAML (and JSON, which yaml-cpp also reads), checked while yaml-cpp
// parses, so that a deeply nested input is refused with a clear error long before any
// recursion (yaml-cpp's or the reader's) gets deep enough to matter.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shoal {

// Default nesting limit of Shoal's configuration files (their schemas need fewer than 5).
inline constexpr int kMaxYamlDepth = 32;

// Parses `text` with yaml-cpp's event parser, stopping at the first mapping or list nested more
// than `max_depth` levels deep. OK when the text is within the limit or is not valid YAML (the
// real parse reports syntax errors). INVALID_ARGUMENT
// "<source>:<line>:<column>: nested more than 32 levels deep (the limit)" otherwise.
absl::Status CheckYamlDepth(absl::string_view text, absl::string_view source,
                            int max_depth = kMaxYamlDepth);

}  // namespace shoal
