#include "libs/training/model_evaluator.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/training/loss.h"
#include "libs/training/model_evaluation.h"
#include "libs/training/model_state.h"

namespace shoal::training {

absl::StatusOr<EvalStats> EvaluateModel(Model& model, const EvalData& data,
                                        const std::function<bool()>& keep_going,
                                        EvalStats* so_far) {
  EvalStats own;
  EvalStats& stats = so_far != nullptr ? *so_far : own;
  try {
    torch::NoGradGuard no_grad;
    model.SetTraining(false);
    absl::Cleanup training_again = [&model] { model.SetTraining(true); };
    const int64_t n = data.labels.size(0);
    // The same batches as one uninterrupted pass: each begins where the one before ended.
    for (auto begin = static_cast<int64_t>(stats.total); begin < n; begin += data.batch_size) {
      if (keep_going && !keep_going()) return absl::CancelledError("evaluation stopped");
      const int64_t end = std::min(n, begin + static_cast<int64_t>(data.batch_size));
      torch::Tensor x = data.images.slice(0, begin, end);
      torch::Tensor y = data.labels.slice(0, begin, end);
      torch::Tensor out = model.Forward(x);
      stats.loss_sum += TaskLoss(data.loss, out, y, data.num_classes).item<double>() *
                        static_cast<double>(end - begin);
      stats.correct += PredictClasses(out).eq(y).sum().item<int64_t>();
      stats.total += static_cast<uint64_t>(end - begin);
    }
  } catch (const std::exception& e) {
    return TorchError("evaluating", e);
  }
  return stats;
}

ModelEvaluator::ModelEvaluator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelEvaluator::~ModelEvaluator() = default;

absl::StatusOr<EvalStats> ModelEvaluator::Evaluate(const tensor::FlatModel& state,
                                                   const std::function<bool()>& keep_going,
                                                   EvalStats* so_far) {
  Impl& m = *impl_;
  const bool with_buffers = state.layout == m.state_layout;
  if (!with_buffers && !(state.layout == m.params_layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model state layout ", state.layout.DebugString(),
                     " does not match this task's model ", m.state_layout.DebugString()));
  }
  if (state.values.size() != state.layout.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model has ", state.values.size(), " values, its layout ", state.layout.total_elements()));
  }
  try {
    // A thread LibTorch did not start takes its intra-op thread count from the process's
    // setting (SetTorchThreads) only when asked to.
    at::init_num_threads();
    if (!m.on_cpu) {
      SHOAL_RETURN_IF_ERROR(
          LoadState(*m.model, state.layout, m.params_layout, ReadFromMemory(state.values)));
      return EvaluateModel(*m.model, m.data, keep_going, so_far);
    }
    // The model's tensors become views of `state` for this call; each gets its own data back
    // (a parameter: none) on every path out.
    std::vector<torch::Tensor> targets;  // in the layout's order
    for (auto& [name, p] : m.model->NamedParameters()) targets.push_back(p);
    if (with_buffers) {
      for (auto& [name, b] : FloatBuffers(*m.model)) targets.push_back(b);
    }
    if (targets.size() != state.layout.num_tensors()) {
      return absl::InternalError("model tensors do not match their layout");
    }
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> own;
    own.reserve(targets.size());
    absl::Cleanup restore = [&] {
      for (size_t i = 0; i < own.size(); ++i) targets[i].set_data(own[i]);
    };
    // Read only: the model runs without gradients in evaluation mode.
    float* values = const_cast<float*>(state.values.data());
    for (size_t i = 0; i < targets.size(); ++i) {
      own.push_back(targets[i].detach());
      targets[i].set_data(torch::from_blob(values + state.layout.offset(i),
                                           state.layout.tensors()[i].shape, torch::kFloat32));
    }
    return EvaluateModel(*m.model, m.data, keep_going, so_far);
  } catch (const std::exception& e) {
    return TorchError("evaluating", e);
  }
}

}  // namespace shoal::training
