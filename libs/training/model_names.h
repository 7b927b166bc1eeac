#pragma once

// Torch-free: which model names libs/training can build.

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shoal::training {

// Names MakeModel accepts, sorted: {"cnn", "mlp"}.
std::vector<std::string> KnownModels();

// OK when MakeModel knows `name`; else INVALID_ARGUMENT "unknown model "x" (known: cnn, mlp)".
absl::Status CheckModelName(const std::string& name);

}  // namespace shoal::training
