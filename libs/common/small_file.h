#pragma once

// Reading small configuration files (task files, dpwa configs) with a size cap that is checked
// before the contents are read, so a huge or endless input cannot exhaust memory.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

// The whole of `path`, if it holds at most `max_bytes`. `what` names the file's kind in errors
// ("task file"). A regular file is measured with fstat before anything is read; other files
// (pipes, /dev/stdin) are read up to max_bytes + 1 bytes. Errors: NOT_FOUND missing file,
// PERMISSION_DENIED, INVALID_ARGUMENT too large / a directory, INTERNAL other read errors; each
// message starts with the path, e.g. "big.yaml: the task file is 52428800 bytes, over the limit
// of 1048576 bytes (1 MiB)".
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes,
                                          absl::string_view what);

// "1048576 bytes (1 MiB)": a byte count for messages, with its size in KiB/MiB when exact.
std::string DescribeBytes(size_t bytes);

}  // namespace shoal
