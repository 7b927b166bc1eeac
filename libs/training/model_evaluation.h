#pragma once

// The evaluation loop Trainer::Evaluate and ModelEvaluator share, and ModelEvaluator's state.
// Exposes LibTorch: for libs/training only.

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/model_evaluator.h"
#include "libs/training/models.h"
#include "libs/training/trainer.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::training {

// A test slice and how it is evaluated. The tensors are shared (read only) with the trainer.
struct EvalData {
  torch::Tensor images, labels;
  common::v1::Loss loss = common::v1::LOSS_UNSPECIFIED;
  int num_classes = 0;
  int batch_size = 128;
};

// `model` (switched to evaluation mode and back) on `data`, batch by batch in order, asking
// `keep_going` (null: always) before each batch: CANCELLED once it is false. With `so_far`
// (ModelEvaluator::Evaluate), after its first `so_far->total` samples, each batch's counts added
// into it. LibTorch errors become INTERNAL.
absl::StatusOr<EvalStats> EvaluateModel(Model& model, const EvalData& data,
                                        const std::function<bool()>& keep_going,
                                        EvalStats* so_far = nullptr);

struct ModelEvaluator::Impl {
  std::unique_ptr<Model> model;
  EvalData data;
  tensor::ModelLayout params_layout;  // the parameters
  tensor::ModelLayout state_layout;   // the parameters, then the float buffers
  bool on_cpu = true;
};

}  // namespace shoal::training
