#pragma once

// The model fields of a task: a built-in model by name, or the user's TorchScript file, which
// every machine holds its own copy of and which the task identifies by its SHA-256.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::task {

// Checks model, model_width, torchscript and loss. INVALID_ARGUMENT "<field>: <what>", e.g.
// "torchscript.sha256: required ...". Part of ValidateTaskSpec.
absl::Status ValidateModelFields(const common::v1::TaskSpec& spec);

// Where the model file of `spec` lies for a reader whose model directory is `model_dir`: the
// file as written when absolute or when model_dir is empty, else model_dir/file.
std::string ModelFilePath(const common::v1::TaskSpec& spec, const std::string& model_dir);

// For a TorchScript task read from a file in `model_dir`: fills torchscript.sha256 from the
// model file. A file that is absent is an error (NOT_FOUND naming the path) unless the task
// gives the digest itself; a digest given in the task that differs from the file's is
// INVALID_ARGUMENT naming both. Nothing to do for built-in models.
absl::Status ResolveModelFile(common::v1::TaskSpec& spec, const std::string& model_dir);

// OK when the file at `path` is the one `spec` names (its SHA-256 equals torchscript.sha256).
// FAILED_PRECONDITION names the path and both digests; NOT_FOUND a missing file.
absl::Status CheckModelFile(const common::v1::TaskSpec& spec, const std::string& path);

}  // namespace shoal::task
