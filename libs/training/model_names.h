#pragma once

// Torch-free: which model names libs/training can build.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shoal::training {

// Names MakeModel accepts, sorted: {"cnn", "mlp", "wide-mlp"}.
std::vector<std::string> KnownModels();

// OK when MakeModel knows `name`; else INVALID_ARGUMENT "unknown model "x" (known: cnn, mlp,
// wide-mlp)".
absl::Status CheckModelName(const std::string& name);

// wide-mlp: the width of its hidden layers when the task gives none, and the range allowed.
inline constexpr uint32_t kDefaultWideMlpWidth = 5000;
inline constexpr uint32_t kMinWideMlpWidth = 16;
inline constexpr uint32_t kMaxWideMlpWidth = 16384;

}  // namespace shoal::training
