#pragma once

// SHA-256 of files (OpenSSL), for files that several machines must hold identical copies of,
// such as a task's TorchScript model.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

// Lower-case hex SHA-256 of the file's bytes, read in blocks (any size). Errors: NOT_FOUND
// missing file; FAILED_PRECONDITION a directory or unreadable file; each names the path.
absl::StatusOr<std::string> Sha256File(const std::string& path);

// Whether `text` looks like a digest Sha256File returns: 64 lower-case hex digits.
bool IsSha256Hex(absl::string_view text);

}  // namespace shoal
