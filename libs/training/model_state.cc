#include "libs/training/model_state.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/heap.h"
#include "libs/common/status_macros.h"
#include "libs/task/task_model.h"
#include "libs/training/trainer.h"

namespace shoal::training {
namespace {

constexpr char kBufferPrefix[] = "buffer:";

}  // namespace

absl::Status TorchError(const std::string& what, const std::exception& e) {
  std::string msg = e.what();
  // c10::Error messages carry a long backtrace after the first line.
  if (size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return absl::InternalError(absl::StrCat(what, ": ", msg));
}

absl::StatusOr<tensor::ModelLayout> LayoutOf(Model& model) {
  std::vector<tensor::TensorSpec> specs;
  for (const auto& [name, value] : model.NamedParameters()) {
    specs.push_back({name, value.sizes().vec()});
  }
  return tensor::ModelLayout::Create(std::move(specs));
}

std::vector<std::pair<std::string, torch::Tensor>> FloatBuffers(Model& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, value] : model.NamedBuffers()) {
    if (value.scalar_type() == torch::kFloat32) out.emplace_back(name, value);
  }
  return out;
}

absl::StatusOr<tensor::ModelLayout> StateLayoutOf(Model& model) {
  std::vector<tensor::TensorSpec> specs;
  for (const auto& [name, value] : model.NamedParameters()) {
    specs.push_back({name, value.sizes().vec()});
  }
  for (const auto& [name, t] : FloatBuffers(model)) {
    specs.push_back({kBufferPrefix + name, t.sizes().vec()});
  }
  return tensor::ModelLayout::Create(std::move(specs));
}

namespace {

// The parameters, into `buffer`'s storage; `capacity` (at least the layout's size) leaves room
// for what FlattenState appends, so the model is never copied to grow.
absl::StatusOr<tensor::FlatModel> Flatten(Model& model, const tensor::ModelLayout& layout,
                                          size_t capacity, std::vector<float> buffer) {
  tensor::FlatModel out;
  out.layout = layout;
  out.values = std::move(buffer);
  ReserveLarge(out.values, std::max(capacity, layout.total_elements()));
  out.values.resize(layout.total_elements());
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> params = model.NamedParameters();
  if (!params.empty() && !params.front().second.is_cpu()) {
    // On a GPU: gather the parameters on the device and copy them to host memory once, not
    // once per tensor.
    std::vector<torch::Tensor> flat;
    for (const auto& [name, value] : params) flat.push_back(value.detach().reshape({-1}));
    torch::Tensor host = torch::cat(flat).to(torch::kCPU).contiguous();
    if (static_cast<size_t>(host.numel()) != out.values.size()) {
      return absl::InternalError("model parameters do not match their layout");
    }
    std::memcpy(out.values.data(), host.data_ptr<float>(), out.values.size() * sizeof(float));
    return out;
  }
  size_t i = 0;
  for (const auto& [name, value] : params) {
    torch::Tensor t = value.detach().contiguous();
    const size_t n = static_cast<size_t>(t.numel());
    if (i >= layout.num_tensors() || layout.tensors()[i].NumElements() != t.numel()) {
      return absl::InternalError("model parameters do not match their layout");
    }
    std::memcpy(out.values.data() + layout.offset(i), t.data_ptr<float>(), n * sizeof(float));
    ++i;
  }
  return out;
}

}  // namespace

absl::StatusOr<tensor::FlatModel> FlattenState(Model& model, const tensor::ModelLayout& layout,
                                               const tensor::ModelLayout& params_layout,
                                               std::vector<float> buffer) {
  SHOAL_ASSIGN_OR_RETURN(tensor::FlatModel out,
                         Flatten(model, params_layout, layout.total_elements(), std::move(buffer)));
  if (layout == params_layout) return out;
  torch::NoGradGuard no_grad;
  out.layout = layout;
  out.values.resize(layout.total_elements());
  size_t i = params_layout.num_tensors();
  for (const auto& [name, buffer] : FloatBuffers(model)) {
    torch::Tensor t = buffer.detach().to(torch::kCPU).contiguous();
    if (i >= layout.num_tensors() || layout.tensors()[i].NumElements() != t.numel()) {
      return absl::InternalError("model buffers do not match their layout");
    }
    std::memcpy(out.values.data() + layout.offset(i), t.data_ptr<float>(),
                static_cast<size_t>(t.numel()) * sizeof(float));
    ++i;
  }
  return out;
}

absl::Status LoadState(Model& model, const tensor::ModelLayout& layout,
                       const tensor::ModelLayout& params_layout, const tensor::ReadValues& read) {
  std::vector<torch::Tensor> targets;  // in `layout` order
  for (auto& [name, p] : model.NamedParameters()) targets.push_back(p);
  if (!(layout == params_layout)) {
    for (auto& [name, b] : FloatBuffers(model)) targets.push_back(b);
  }
  if (targets.size() != layout.num_tensors()) {
    return absl::InternalError("model tensors do not match their layout");
  }
  torch::NoGradGuard no_grad;
  if (!targets.empty() && !targets.front().is_cpu()) {
    // On a GPU: the whole state to device memory in one copy, then split there.
    const auto total = static_cast<int64_t>(layout.total_elements());
    torch::Tensor host = torch::empty({total}, torch::kFloat32);
    SHOAL_RETURN_IF_ERROR(read(0, absl::MakeSpan(host.data_ptr<float>(), layout.total_elements())));
    torch::Tensor all = host.to(targets.front().device());
    for (size_t i = 0; i < targets.size(); ++i) {
      const auto offset = static_cast<int64_t>(layout.offset(i));
      targets[i].copy_(all.slice(0, offset, offset + targets[i].numel()).view(targets[i].sizes()));
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    torch::Tensor& t = targets[i];
    const auto n = static_cast<size_t>(t.numel());
    if (layout.tensors()[i].NumElements() != t.numel()) {
      return absl::InternalError("model tensors do not match their layout");
    }
    if (t.is_contiguous() && t.scalar_type() == torch::kFloat32) {
      SHOAL_RETURN_IF_ERROR(read(layout.offset(i), absl::MakeSpan(t.data_ptr<float>(), n)));
    } else {
      torch::Tensor staged = torch::empty(t.sizes(), torch::kFloat32);
      SHOAL_RETURN_IF_ERROR(read(layout.offset(i), absl::MakeSpan(staged.data_ptr<float>(), n)));
      t.copy_(staged);
    }
  }
  return absl::OkStatus();
}

tensor::ReadValues ReadFromMemory(const std::vector<float>& values) {
  return [&values](size_t first, absl::Span<float> out) {
    if (first > values.size() || out.size() > values.size() - first) {
      return absl::InternalError("reading past the end of a model");
    }
    std::memcpy(out.data(), values.data() + first, out.size() * sizeof(float));
    return absl::OkStatus();
  };
}

// Declared in trainer.h, beside the trainer whose state it writes.
absl::Status WriteTorchScript(const common::v1::TaskSpec& spec, const std::string& model_dir,
                              const tensor::FlatModel& model, const std::string& out_path) {
  if (spec.model() != kTorchScriptModel) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the task's model ", spec.model(),
        " is built in and has no TorchScript form; only a task whose model is a TorchScript "
        "file (model: {torchscript: FILE}) can be written as one"));
  }
  const std::string script_path = task::ModelFilePath(spec, model_dir);
  SHOAL_RETURN_IF_ERROR(task::CheckModelFile(spec, script_path));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> script, LoadModel(spec, script_path));
  SHOAL_ASSIGN_OR_RETURN(tensor::ModelLayout layout, LayoutOf(*script));
  SHOAL_ASSIGN_OR_RETURN(tensor::ModelLayout state_layout, StateLayoutOf(*script));
  if (!(model.layout == layout || model.layout == state_layout) ||
      model.values.size() != model.layout.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("model layout ", model.layout.DebugString(),
                                                   " does not match the TorchScript file's ",
                                                   state_layout.DebugString()));
  }
  // The parameters, then the float buffers (batch-norm statistics) when the model carries them;
  // otherwise the file's own buffers stay.
  try {
    SHOAL_RETURN_IF_ERROR(LoadState(*script, model.layout, layout, ReadFromMemory(model.values)));
  } catch (const std::exception& e) {
    return TorchError("setting parameters", e);
  }
  // Written beside the target and renamed, so a failed write never leaves half a file.
  const std::string tmp = out_path + ".part";
  if (absl::Status s = script->SaveTorchScript(tmp); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("renaming ", tmp, " to ", out_path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace shoal::training
