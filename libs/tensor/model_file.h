#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/tensor/flat_model.h"

namespace shoal::tensor {

// Model files: a small header (magic "SHOALMDL", format version, layout, value digest) followed
// by the raw little-endian float32 values. Used for checkpoints and `model get --out FILE`.
//
// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of the directory.
// Errors: INTERNAL / the errno mapping on I/O failures, with the path in the message.
absl::Status WriteModelFile(const std::string& path, const FlatModel& model);

// Writes the same bytes to an open descriptor (a pipe: `model get --out -`); `what` names it in
// errors. Not atomic: on error the reader gets a truncated file, which ReadModelFile rejects.
absl::Status WriteModel(int fd, const FlatModel& model, const std::string& what);

// Reads and verifies a model file (magic, version, layout sanity, exact size, header checksum
// and value digest). Errors: NOT_FOUND missing file; DATA_LOSS corrupt or truncated file;
// INVALID_ARGUMENT not a model file / unsupported format version.
absl::StatusOr<FlatModel> ReadModelFile(const std::string& path);

// Same checks for a model file open as `fd` (a regular file positioned at its start; its size
// comes from fstat); `what` names it in errors.
absl::StatusOr<FlatModel> ReadModel(int fd, const std::string& what);

}  // namespace shoal::tensor
