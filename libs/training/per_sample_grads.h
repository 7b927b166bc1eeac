#pragma once

// Exact per-sample gradients of a batch, what record-level DP-SGD (dp_sgd.h) clips one by one.
// For a batch of N samples and a model of D parameters the result holds N x D floats (memory:
// N times the model; a wide model with large batches may not fit).
//
// Two ways to compute them, chosen once per model by ChoosePerSampleGrads:
//  - LayerwisePerSampleGrads, the fast path, for a model whose forward pass is a chain of known
//    layers (Net::Layers: the built-in mlp, wide-mlp and cnn): one forward pass that keeps each
//    Linear/Conv2d layer's input a and output z, one torch::autograd::grad of the summed loss
//    with respect to every z (g = dL/dz; samples do not mix, so g_i is sample i's own), then per
//    sample: Linear grad_w[i] = g_i^T a_i, grad_b[i] = Σ g_i; Conv2d the same over the unfolded
//    input patches (im2col, torch unfold). Cost: about one batch backward plus an einsum per
//    layer; for DP-SGD's clipped sum (ClippedSum) Linear layers need no per-sample tensor.
//  - LoopPerSampleGrads, the fallback, for any model (TorchScript included): one forward and one
//    backward per sample. Cost: N small passes, several times slower than the fast path.
// A model with batch normalisation is refused: its output for one sample depends on the others,
// so a sample's own gradient does not exist.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/training/models.h"

namespace shoal::training {

// The loss of a batch: `out` is the model's output for the batch, `y` its labels; the mean over
// the batch of each sample's own loss (as TaskLoss computes it).
using BatchLoss = std::function<torch::Tensor(const torch::Tensor& out, const torch::Tensor& y)>;

// What DP-SGD needs from a batch: each sample's whole-model gradient clipped to L2 norm C and
// summed over the batch, and the norms before clipping.
struct ClippedGradients {
  // One per parameter, in Model::NamedParameters order, of the parameter's shape:
  // sum over samples i of min(1, C / norm_i) x sample i's gradient.
  std::vector<torch::Tensor> sums;
  std::vector<double> norms;  // norm_i: sample i's gradient, every parameter together (L2)
};

// ClippedSum from per-sample gradients already computed ([N, parameter shape...] each; N may be
// 0): two passes over them (norms, then one matrix-vector product per parameter), no copy.
ClippedGradients ClipAndSumPerSample(const std::vector<torch::Tensor>& per_sample,
                                     const std::vector<torch::Tensor>& params, double clip_norm);

class PerSampleGrads {
 public:
  virtual ~PerSampleGrads() = default;
  // One tensor per parameter of the model, in Model::NamedParameters order, of shape
  // [N, parameter shape...]: row i is the gradient of sample i's own loss. Leaves the
  // parameters' .grad() untouched. INVALID_ARGUMENT on an empty batch or x and y of different
  // sizes; INTERNAL when LibTorch fails (its first message line).
  virtual absl::StatusOr<std::vector<torch::Tensor>> Compute(const torch::Tensor& x,
                                                             const torch::Tensor& y) = 0;
  // The batch's clipped sum at clip norm `clip_norm` (> 0); same errors as Compute. The fast
  // path never holds the N x D per-sample gradients of a Linear layer: a Linear gradient is an
  // outer product, so its norm is |g_i| |a_i| and the clipped sum is one matrix product
  // ("ghost clipping", Goodfellow 2015; Li et al. 2022). The fallback computes them and calls
  // ClipAndSumPerSample. A sample whose gradient is not finite gets a non-finite norm.
  virtual absl::StatusOr<ClippedGradients> ClippedSum(const torch::Tensor& x,
                                                      const torch::Tensor& y, double clip_norm);
  // "layerwise" or "loop", for logs.
  virtual std::string Kind() const = 0;
};

// The fast path's per-layer formulas over the model's chain of layers. INVALID_ARGUMENT (the
// message names the layer) when the model has no chain, a layer the fast path does not know or
// a parameter outside the chain's Linear and Conv2d layers. Keeps a reference to `model`.
absl::StatusOr<std::unique_ptr<PerSampleGrads>> MakeLayerwisePerSampleGrads(Model& model,
                                                                            BatchLoss loss);

// One backward pass per sample; any model. Keeps a reference to `model`.
std::unique_ptr<PerSampleGrads> MakeLoopPerSampleGrads(Model& model, BatchLoss loss);

// FAILED_PRECONDITION naming the layer when `model` has batch normalisation (a module whose kind
// names BatchNorm, built-in or TorchScript), or naming a parameter that does not require a
// gradient.
absl::Status CheckSupportsPerSampleGrads(Model& model);

// CheckSupportsPerSampleGrads, then the fast path when the model's structure allows it, the
// fallback otherwise.
absl::StatusOr<std::unique_ptr<PerSampleGrads>> ChoosePerSampleGrads(Model& model, BatchLoss loss);

}  // namespace shoal::training
