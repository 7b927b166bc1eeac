#pragma once

// Record-level DP-SGD's gradient (Abadi et al. 2016, "Deep Learning with Differential Privacy"):
// from the exact per-sample gradients of a batch (per_sample_grads.h), clip each sample's
// whole-model gradient (all parameters together) to L2 norm clip_norm, sum them, add Gaussian
// noise N(0, (noise_multiplier · clip_norm)²) to every coordinate, and divide by the expected
// batch size. The result goes into the parameters' .grad(), where the trainer's optimizer steps
// with it. Cost: two passes over the N x D per-sample gradients (the norms, then the clipped sum
// as one matrix-vector product per tensor) and no copy of them, plus D Gaussian draws.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/privacy/dp_update.h"
#include "libs/training/per_sample_grads.h"

namespace shoal::training {

struct DpSgdOptions {
  double clip_norm = 1.0;         // C > 0: the most one sample's gradient contributes (L2)
  double noise_multiplier = 1.0;  // σ >= 0: the noise's stddev is σ · C
  // The divisor: the batch size a sampler draws on average (Poisson sampling), or the fixed
  // batch size. 0: the size of each batch.
  double expected_batch_size = 0;

  // INVALID_ARGUMENT naming the field: a value not finite or out of range.
  absl::Status Validate() const;
};

// What one DpSgdStep::Apply did, for logs and tests.
struct DpSgdStats {
  int64_t samples = 0;
  int64_t clipped = 0;         // samples whose gradient norm exceeded clip_norm
  double max_sample_norm = 0;  // the largest norm before clipping
};

// Owns the noise source; one per trainer. Not thread-safe.
class DpSgdStep {
 public:
  // Validates `options`. Production passes GaussianNoise::FromSystemEntropy(); tests a fixed
  // seed.
  static absl::StatusOr<DpSgdStep> Create(const DpSgdOptions& options,
                                          privacy::GaussianNoise noise);

  // per_sample[k] is [N, params[k] shape...] (PerSampleGrads::Compute); writes the noisy mean
  // into params[k].grad() (allocated when undefined). N = 0 (a Poisson batch that drew nothing)
  // gives the noise alone over expected_batch_size. INVALID_ARGUMENT when the counts or shapes
  // do not match (naming the parameter's index), N = 0 without an expected_batch_size, or a
  // sample's gradient is not finite (naming the sample); nothing is written then.
  absl::StatusOr<DpSgdStats> Apply(const std::vector<torch::Tensor>& per_sample,
                                   const std::vector<torch::Tensor>& params);

  // The same from a batch's clipped sum (PerSampleGrads::ClippedSum, whose fast path never
  // holds the per-sample gradients): noise, the divisor, .grad(). A norm that is not finite is
  // refused (naming the sample) and nothing is written.
  absl::StatusOr<DpSgdStats> ApplyClipped(const ClippedGradients& clipped,
                                          const std::vector<torch::Tensor>& params);

  const DpSgdOptions& options() const { return options_; }

 private:
  DpSgdStep(const DpSgdOptions& options, privacy::GaussianNoise noise)
      : options_(options), noise_(noise) {}

  DpSgdOptions options_;
  privacy::GaussianNoise noise_;
};

}  // namespace shoal::training
