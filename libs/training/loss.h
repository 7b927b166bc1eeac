#pragma once

// The losses a task can train with (TaskSpec.loss) and how a model's output becomes a class.
// Exposes LibTorch: for libs/training only.

#include <torch/torch.h>

#include "absl/status/status.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::training {

// The task's loss of `out` (the model's output for a batch) against class labels `y` (int64
// [N]), averaged over the batch: cross-entropy of logits; mse and bce against the one-hot class
// (summed over the classes); bce with one output per sample against the label itself.
torch::Tensor TaskLoss(common::v1::Loss loss, const torch::Tensor& out, const torch::Tensor& y,
                       int num_classes);

// The class each sample of `out` predicts: argmax over the classes, or for one output per
// sample (binary bce) whether the logit is positive.
torch::Tensor PredictClasses(const torch::Tensor& out);

// OK when `out`, the model's output for one sample, suits `loss` with `num_classes` classes:
// [1, C], or also [1] or [1, 1] for bce with two classes. INVALID_ARGUMENT naming the shape
// found and the one needed.
absl::Status CheckOutputFits(common::v1::Loss loss, const torch::Tensor& out, int num_classes);

}  // namespace shoal::training
