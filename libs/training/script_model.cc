// The two kinds of Model: a built-in torch::nn::Module (Net) and a TorchScript module.

#include <torch/script.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/status_macros.h"
#include "libs/training/models.h"

namespace shoal::training {
namespace {

class NetModel final : public Model {
 public:
  explicit NetModel(std::shared_ptr<Net> net) : net_(std::move(net)) {}
  torch::Tensor Forward(const torch::Tensor& x) override { return net_->forward(x); }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : net_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedBuffers() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : net_->named_buffers()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void SetTraining(bool on) override { net_->train(on); }
  void To(const torch::Device& device) override { net_->to(device); }
  std::vector<std::pair<std::string, std::string>> NamedModuleKinds() override {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& item : net_->named_modules())
      out.emplace_back(item.key(), item.value()->name());
    return out;
  }
  torch::nn::Sequential Layers() override { return net_->Layers(); }
  torch::Tensor PrepareInputs(const torch::Tensor& samples) override {
    return net_->PrepareInputs(samples);
  }
  absl::Status SaveTorchScript(const std::string&) override {
    return absl::FailedPreconditionError(
        "a built-in model has no TorchScript form; only a task whose model is a TorchScript "
        "file can be written as one");
  }

 private:
  std::shared_ptr<Net> net_;
};

class ScriptModel final : public Model {
 public:
  explicit ScriptModel(torch::jit::Module module) : module_(std::move(module)) {}
  torch::Tensor Forward(const torch::Tensor& x) override {
    c10::IValue out = module_.forward({x});
    if (!out.isTensor()) {
      throw std::runtime_error(
          absl::StrCat("the model's forward() returned ", out.tagKind(), ", not a tensor"));
    }
    return out.toTensor();
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
      out.emplace_back(item.name, item.value);
    }
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedBuffers() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_.named_buffers(/*recurse=*/true)) {
      out.emplace_back(item.name, item.value);
    }
    return out;
  }
  void SetTraining(bool on) override { module_.train(on); }
  void To(const torch::Device& device) override { module_.to(device); }
  std::vector<std::pair<std::string, std::string>> NamedModuleKinds() override {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& item : module_.named_modules()) {
      const c10::optional<c10::QualifiedName>& kind = item.value.type()->name();
      out.emplace_back(item.name, kind ? kind->qualifiedName() : std::string("?"));
    }
    return out;
  }
  torch::nn::Sequential Layers() override { return torch::nn::Sequential(nullptr); }
  torch::Tensor PrepareInputs(const torch::Tensor& samples) override { return samples; }
  absl::Status SaveTorchScript(const std::string& path) override {
    try {
      module_.save(path);
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("writing TorchScript file ", EscapeBytes(path), ": ", ErrorFirstLine(e)));
    }
    return absl::OkStatus();
  }

 private:
  torch::jit::Module module_;
};

absl::StatusOr<std::unique_ptr<Model>> LoadScript(const std::string& path) {
  const std::string shown = EscapeBytes(path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("model file ", shown, ": no such file"));
  }
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("model file ", shown, ": not a regular file"));
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model file ", shown,
        " is not a TorchScript file (save one with torch.jit.script(model).save(FILE)): ",
        ErrorFirstLine(e)));
  }
  auto model = std::make_unique<ScriptModel>(std::move(module));
  std::vector<std::pair<std::string, torch::Tensor>> params = model->NamedParameters();
  if (params.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file ", shown, " has no parameters to train"));
  }
  for (const auto& [name, p] : params) {
    if (p.scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat("model file ", shown, ": parameter ", name, " is ",
                       std::string(c10::toString(p.scalar_type())),
                       "; Shoal trains float32 parameters (call model.float() before saving)"));
    }
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const common::v1::TaskSpec& spec,
                                                 const std::string& script_path) {
  if (spec.model() == kTorchScriptModel) return LoadScript(script_path);
  SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Net> net,
                         MakeModel(spec.model(), spec.seed(), spec.model_width()));
  return WrapNet(std::move(net));
}

std::string ErrorFirstLine(const std::exception& e) {
  std::string msg = e.what();
  // c10::Error messages carry a long backtrace after the first line.
  if (size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return msg;
}

std::unique_ptr<Model> WrapNet(std::shared_ptr<Net> net) {
  return std::make_unique<NetModel>(std::move(net));
}

}  // namespace shoal::training
