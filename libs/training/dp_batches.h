#pragma once

// Record-level DP-SGD in the trainer (TaskSpec.privacy.dp, level sample): how one step of a
// peer's training draws its batch and computes the gradient its optimizer steps with.
//  - Poisson sampling: each sample of the peer's training shard joins the step's batch with
//    probability q = batch_size / shard size (1 when the shard is smaller), independently, so a
//    batch holds batch_size samples on average and may hold none. This is the sampling the
//    accountant's sampled Gaussian mechanism assumes (the coordinator charges round_batches
//    steps at the smallest shard's q per round). The draws come from the system's entropy: a
//    sampler someone could replay would tell which records were in which step.
//  - The gradient: exact per-sample gradients (per_sample_grads.h), each clipped to clip_norm,
//    summed, Gaussian noise of stddev noise_multiplier x clip_norm added, divided by batch_size
//    (the expected batch, not the drawn one: dp_sgd.h). An empty batch still takes its step: the
//    noise alone.
// Cost per step: the per-sample gradients (layerwise fast path for the built-in models, one
// backward pass per sample for TorchScript models) and N x D floats of memory for a batch of N.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/training/dp_sgd.h"
#include "libs/training/models.h"
#include "libs/training/per_sample_grads.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::training {

struct DpBatchStats {
  int64_t samples = 0;  // drawn into this step's batch
  double loss = 0;      // the batch's mean loss before the step (0 for an empty batch)
  DpSgdStats clipping;
};

// One per trainer; keeps references to the model. Not thread-safe.
class DpSgdBatches {
 public:
  // `spec` has privacy.dp at level sample; `shard_size` is the peer's training samples (>= 1).
  // Errors: FAILED_PRECONDITION for a model without per-sample gradients (batch normalisation,
  // naming the layer); INVALID_ARGUMENT for bad DP settings (naming the field); INTERNAL when
  // the system has no entropy.
  static absl::StatusOr<std::unique_ptr<DpSgdBatches>> Create(const common::v1::TaskSpec& spec,
                                                              Model& model, int num_classes,
                                                              int64_t shard_size);

  // Draws one batch from `images`/`labels` (the whole shard, on the model's device) and writes
  // the step's noisy gradient into the parameters' .grad(); the caller steps the optimizer.
  // Errors: INVALID_ARGUMENT a sample's gradient is not finite; INTERNAL LibTorch failed.
  absl::StatusOr<DpBatchStats> Step(const torch::Tensor& images, const torch::Tensor& labels);

  double sampling_rate() const { return q_; }
  // For the peer's log: "DP-SGD: Poisson batches at q 0.0213, clip_norm 1, noise_multiplier
  // 1.1, per-sample gradients layerwise".
  std::string Describe() const;

 private:
  DpSgdBatches(Model& model, BatchLoss loss, std::unique_ptr<PerSampleGrads> grads, DpSgdStep step,
               double q, std::mt19937_64 sampler);

  Model& model_;
  BatchLoss loss_;
  std::unique_ptr<PerSampleGrads> grads_;
  DpSgdStep step_;
  double q_;
  std::mt19937_64 sampler_;
  std::vector<torch::Tensor> params_;  // Model::NamedParameters order, what grads_ returns
};

}  // namespace shoal::training
