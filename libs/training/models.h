#pragma once

// LibTorch models by name. Only libs/training (and its tests) include this header.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/training/model_names.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::training {

// A classifier over [N, 1, 28, 28] images returning [N, 10] logits. Not thread-safe.
class Net : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // The forward pass as one chain of layers, when it is one (the built-in models: their
  // forward() runs exactly this chain); an empty holder otherwise. per_sample_grads.h runs a
  // chain layer by layer for its fast path.
  virtual torch::nn::Sequential Layers() { return torch::nn::Sequential(nullptr); }
  // The samples as the model's layers take them: a fixed transform without parameters that the
  // trainer applies once to each data set it holds (its training shard and test slice), not at
  // every step. The samples themselves for every model but scatter-linear and scatter-cnn
  // (scattering.h).
  virtual torch::Tensor PrepareInputs(const torch::Tensor& samples) { return samples; }
};

// Builds model `name` with weights drawn after torch::manual_seed(seed), so two processes with
// the same name and seed build identical weights. Serialised by a process-wide mutex because the
// torch seed is global. `width` is wide-mlp's hidden width (0: kDefaultWideMlpWidth); the other
// models ignore it. Errors: INVALID_ARGUMENT unknown name (the message lists the known ones) or
// a width out of range; RESOURCE_EXHAUSTED when the weights do not fit in memory.
absl::StatusOr<std::shared_ptr<Net>> MakeModel(const std::string& name, uint64_t seed,
                                               uint32_t width = 0);

// What the trainer drives: a built-in Net, or the user's TorchScript module. Parameters and
// buffers come in a fixed order (registration order, depth first), which is the order of the
// flat model every mode exchanges. Not thread-safe.
class Model {
 public:
  virtual ~Model() = default;
  virtual torch::Tensor Forward(const torch::Tensor& x) = 0;
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() = 0;
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedBuffers() = 0;
  virtual void SetTraining(bool on) = 0;
  virtual void To(const torch::Device& device) = 0;
  // Every submodule (the model itself first, named "") with the name of its kind, e.g.
  // "torch::nn::BatchNorm2dImpl" or a TorchScript class name such as "__torch__.torch.nn.
  // modules.batchnorm.BatchNorm2d".
  virtual std::vector<std::pair<std::string, std::string>> NamedModuleKinds() = 0;
  // The built-in model's chain of layers (Net::Layers); an empty holder for other models.
  virtual torch::nn::Sequential Layers() = 0;
  // The built-in model's fixed transform of the samples (Net::PrepareInputs); the samples
  // themselves for other models.
  virtual torch::Tensor PrepareInputs(const torch::Tensor& samples) = 0;
  // Writes the model with its current parameters as a TorchScript file. FAILED_PRECONDITION for
  // a built-in model (it has no TorchScript form).
  virtual absl::Status SaveTorchScript(const std::string& path) = 0;
};

// The model of `spec`: a built-in one (MakeModel with spec.seed and spec.model_width) or, for
// model "torchscript", the TorchScript file at `script_path` loaded with torch::jit::load (the
// caller checks the file's digest first). Errors: INVALID_ARGUMENT unknown model, a file that is
// not TorchScript (naming it) or has no parameters; NOT_FOUND a missing file.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const common::v1::TaskSpec& spec,
                                                 const std::string& script_path);

// The first line of a LibTorch exception's message (a c10::Error carries a backtrace after it).
std::string ErrorFirstLine(const std::exception& e);

// `net` driven as a Model (what LoadModel does for a built-in model name).
std::unique_ptr<Model> WrapNet(std::shared_ptr<Net> net);

}  // namespace shoal::training
