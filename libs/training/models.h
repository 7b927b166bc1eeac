#pragma once

// LibTorch models by name. Only libs/training (and its tests) include this header.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/training/model_names.h"

namespace shoal::training {

// A classifier over [N, 1, 28, 28] images returning [N, 10] logits. Not thread-safe.
class Net : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// Builds model `name` with weights drawn after torch::manual_seed(seed), so two processes with
// the same name and seed build identical weights. Serialised by a process-wide mutex because the
// torch seed is global. `width` is wide-mlp's hidden width (0: kDefaultWideMlpWidth); the other
// models ignore it. Errors: INVALID_ARGUMENT unknown name (the message lists the known ones) or
// a width out of range; RESOURCE_EXHAUSTED when the weights do not fit in memory.
absl::StatusOr<std::shared_ptr<Net>> MakeModel(const std::string& name, uint64_t seed,
                                               uint32_t width = 0);

}  // namespace shoal::training
