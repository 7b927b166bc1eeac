#include "libs/training/models.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/training/scattering.h"

namespace shoal::training {
namespace {

// A built-in model: its forward() runs its chain of layers (Net::Layers), so per_sample_grads.h's
// fast path runs exactly the same computation. The chain is not registered: each subclass
// registers its parameterised layers by name, in the order of the flat model.
class ChainNet : public Net {
 public:
  torch::Tensor forward(torch::Tensor x) final { return chain_->forward(x); }
  torch::nn::Sequential Layers() final { return chain_; }

 protected:
  torch::nn::Sequential chain_{nullptr};
};

// 784 -> 200 -> 10 with ReLU.
class Mlp final : public ChainNet {
 public:
  Mlp() {
    auto fc1 = register_module("fc1", torch::nn::Linear(784, 200));
    auto fc2 = register_module("fc2", torch::nn::Linear(200, 10));
    chain_ = torch::nn::Sequential(torch::nn::Flatten(), fc1, torch::nn::ReLU(), fc2);
  }
};

// 784 -> w -> w -> 10 with ReLU: a model of realistic size for the data path (w = 5000: 29M
// parameters, 116 MB; w = 10000: 108M).
class WideMlp final : public ChainNet {
 public:
  explicit WideMlp(int64_t width) {
    auto fc1 = register_module("fc1", torch::nn::Linear(784, width));
    auto fc2 = register_module("fc2", torch::nn::Linear(width, width));
    auto fc3 = register_module("fc3", torch::nn::Linear(width, 10));
    chain_ = torch::nn::Sequential(torch::nn::Flatten(), fc1, torch::nn::ReLU(), fc2,
                                   torch::nn::ReLU(), fc3);
  }
};

// conv(1->16, k5, pad 2) -> relu -> maxpool 2 -> conv(16->32, k5, pad 2) -> relu -> maxpool 2
// -> fc(1568->128) -> relu -> fc(128->10).
class Cnn final : public ChainNet {
 public:
  Cnn() {
    using torch::nn::Conv2dOptions;
    auto conv1 = register_module("conv1", torch::nn::Conv2d(Conv2dOptions(1, 16, 5).padding(2)));
    auto conv2 = register_module("conv2", torch::nn::Conv2d(Conv2dOptions(16, 32, 5).padding(2)));
    auto fc1 = register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128));
    auto fc2 = register_module("fc2", torch::nn::Linear(128, 10));
    using torch::nn::MaxPool2d;
    using torch::nn::ReLU;
    chain_ = torch::nn::Sequential(conv1, ReLU(), MaxPool2d(2), conv2, ReLU(), MaxPool2d(2),
                                   torch::nn::Flatten(), fc1, ReLU(), fc2);
  }
};

// The small CNN of the DP-SGD literature for 28 x 28 images (Papernot et al., "Tempered Sigmoid
// Activations for Deep Learning with Differential Privacy", 2020; Tramer and Boneh, ICLR 2021):
// conv(1->16, k8, stride 2, pad 3) -> tanh -> maxpool 2 stride 1 -> conv(16->32, k4, stride 2)
// -> tanh -> maxpool 2 stride 1 -> fc(512->32) -> tanh -> fc(32->10). 26,010 parameters: with
// fewer parameters the same noise multiplier adds less noise in all, and tanh keeps the clipped
// per-sample gradients useful (docs/how-to/privacy.md "Choose the parameters").
class DpCnn final : public ChainNet {
 public:
  DpCnn() {
    using torch::nn::Conv2dOptions;
    auto conv1 =
        register_module("conv1", torch::nn::Conv2d(Conv2dOptions(1, 16, 8).stride(2).padding(3)));
    auto conv2 = register_module("conv2", torch::nn::Conv2d(Conv2dOptions(16, 32, 4).stride(2)));
    auto fc1 = register_module("fc1", torch::nn::Linear(32 * 4 * 4, 32));
    auto fc2 = register_module("fc2", torch::nn::Linear(32, 10));
    using torch::nn::MaxPool2d;
    using torch::nn::MaxPool2dOptions;
    using torch::nn::Tanh;
    chain_ = torch::nn::Sequential(conv1, Tanh(), MaxPool2d(MaxPool2dOptions(2).stride(1)), conv2,
                                   Tanh(), MaxPool2d(MaxPool2dOptions(2).stride(1)),
                                   torch::nn::Flatten(), fc1, Tanh(), fc2);
  }
};

// A model over the scattering features of 28 x 28 images (scattering.h: 81 channels of 7 x 7,
// group-normalised), computed once per data set (PrepareInputs), not at every step.
class ScatteringNet : public ChainNet {
 public:
  torch::Tensor PrepareInputs(const torch::Tensor& samples) final {
    return ScatteringFeatures(samples);
  }
};

// A linear classifier over the scattering features, the "ScatterNet + linear" model of Tramer
// and Boneh (ICLR 2021): 39,700 parameters; a training step costs what a linear model's does.
class ScatterLinear final : public ScatteringNet {
 public:
  ScatterLinear() {
    auto fc = register_module("fc", torch::nn::Linear(kScatteringChannels * 7 * 7, 10));
    chain_ = torch::nn::Sequential(torch::nn::Flatten(), fc);
  }
};

// A small CNN over the same scattering features, the "ScatterNet + CNN" model of Tramer and
// Boneh (ICLR 2021) for 28 x 28 images: conv(81->16, k3, stride 2, pad 1) -> tanh ->
// conv(16->32, k3, pad 1) -> tanh -> fc(512->32) -> tanh -> fc(32->10); 33,066 parameters.
class ScatterCnn final : public ScatteringNet {
 public:
  ScatterCnn() {
    using torch::nn::Conv2dOptions;
    auto conv1 = register_module(
        "conv1", torch::nn::Conv2d(Conv2dOptions(kScatteringChannels, 16, 3).stride(2).padding(1)));
    auto conv2 = register_module("conv2", torch::nn::Conv2d(Conv2dOptions(16, 32, 3).padding(1)));
    auto fc1 = register_module("fc1", torch::nn::Linear(32 * 4 * 4, 32));
    auto fc2 = register_module("fc2", torch::nn::Linear(32, 10));
    using torch::nn::Tanh;
    chain_ =
        torch::nn::Sequential(conv1, Tanh(), conv2, Tanh(), torch::nn::Flatten(), fc1, Tanh(), fc2);
  }
};

std::mutex& SeedMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Net>> MakeModel(const std::string& name, uint64_t seed,
                                               uint32_t width) {
  if (absl::Status s = CheckModelName(name); !s.ok()) return s;
  if (width == 0) width = kDefaultWideMlpWidth;
  if (name == "wide-mlp" && (width < kMinWideMlpWidth || width > kMaxWideMlpWidth)) {
    return absl::InvalidArgumentError(absl::StrCat("model_width must be in ", kMinWideMlpWidth,
                                                   "..", kMaxWideMlpWidth, ", got ", width));
  }
  try {
    std::lock_guard<std::mutex> lock(SeedMutex());
    torch::manual_seed(seed);
    if (name == "cnn") return std::shared_ptr<Net>(std::make_shared<Cnn>());
    if (name == "dp-cnn") return std::shared_ptr<Net>(std::make_shared<DpCnn>());
    if (name == "scatter-linear") return std::shared_ptr<Net>(std::make_shared<ScatterLinear>());
    if (name == "scatter-cnn") return std::shared_ptr<Net>(std::make_shared<ScatterCnn>());
    if (name == "wide-mlp") return std::shared_ptr<Net>(std::make_shared<WideMlp>(width));
    return std::shared_ptr<Net>(std::make_shared<Mlp>());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("building model ", name, " of width ", width, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building model ", name, ": ", e.what()));
  }
}

}  // namespace shoal::training
