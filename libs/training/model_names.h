#pragma once

// Torch-free: which model names libs/training can build.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"

namespace shoal::training {

// TaskSpec.model of a task whose model is the user's TorchScript file (TaskSpec.torchscript).
inline constexpr char kTorchScriptModel[] = "torchscript";

// Names MakeModel accepts, sorted: {"cnn", "dp-cnn", "mlp", "scatter-cnn", "scatter-linear",
// "wide-mlp"}.
inline std::vector<std::string> KnownModels() {
  return {"cnn", "dp-cnn", "mlp", "scatter-cnn", "scatter-linear", "wide-mlp"};
}

// OK when MakeModel knows `name`, or for kTorchScriptModel when `torchscript_ok`; else
// INVALID_ARGUMENT "unknown model "x" (known: cnn, dp-cnn, mlp, scatter-cnn, scatter-linear,
// wide-mlp, torchscript)".
inline absl::Status CheckModelName(const std::string& name, bool torchscript_ok = false) {
  for (const std::string& known : KnownModels()) {
    if (name == known) return absl::OkStatus();
  }
  if (torchscript_ok && name == kTorchScriptModel) return absl::OkStatus();
  std::string known = absl::StrJoin(KnownModels(), ", ");
  if (torchscript_ok) known += ", torchscript";
  return absl::InvalidArgumentError("unknown model \"" + name + "\" (known: " + known + ")");
}

// wide-mlp: the width of its hidden layers when the task gives none, and the range allowed.
inline constexpr uint32_t kDefaultWideMlpWidth = 5000;
inline constexpr uint32_t kMinWideMlpWidth = 16;
inline constexpr uint32_t kMaxWideMlpWidth = 16384;

}  // namespace shoal::training
