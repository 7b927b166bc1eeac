#include "libs/training/dp_sgd.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/training/models.h"
#include "libs/training/per_sample_grads.h"

namespace shoal::training {
namespace {

absl::Status CheckField(const char* name, double value, bool zero_allowed) {
  if (std::isfinite(value) && (value > 0 || (zero_allowed && value == 0))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("DP-SGD option ", name,
                                                 " must be a finite number ",
                                                 zero_allowed ? ">= 0" : "> 0", ", got ", value));
}

std::string Shape(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes().vec(), ", "), "]");
}

// OK when per_sample[k] is [N, params[k] shape...] for every k, with the same N: >= 1, or 0
// when the divisor is fixed (`empty_ok`: a Poisson batch that drew no sample).
absl::Status CheckShapes(const std::vector<torch::Tensor>& per_sample,
                         const std::vector<torch::Tensor>& params, bool empty_ok) {
  if (params.empty() || per_sample.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DP-SGD: ", per_sample.size(), " per-sample gradients for ", params.size(), " parameters"));
  }
  const int64_t n = per_sample[0].dim() > 0 ? per_sample[0].size(0) : 0;
  if (n == 0 && !empty_ok) {
    return absl::InvalidArgumentError(
        "DP-SGD: a batch of no samples (only a fixed expected_batch_size can divide it)");
  }
  for (size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor& g = per_sample[k];
    const bool fits =
        g.dim() == params[k].dim() + 1 && g.size(0) == n && g.sizes().slice(1) == params[k].sizes();
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DP-SGD: the per-sample gradients of parameter ", k, " have shape ", Shape(g),
          "; the parameter is ", Shape(params[k]), " and the batch has ", n, " samples"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DpSgdOptions::Validate() const {
  if (absl::Status s = CheckField("clip_norm", clip_norm, false); !s.ok()) return s;
  if (absl::Status s = CheckField("noise_multiplier", noise_multiplier, true); !s.ok()) return s;
  return CheckField("expected_batch_size", expected_batch_size, true);
}

absl::StatusOr<DpSgdStep> DpSgdStep::Create(const DpSgdOptions& options,
                                            privacy::GaussianNoise noise) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return DpSgdStep(options, noise);
}

absl::StatusOr<DpSgdStats> DpSgdStep::Apply(const std::vector<torch::Tensor>& per_sample,
                                            const std::vector<torch::Tensor>& params) {
  if (absl::Status s = CheckShapes(per_sample, params, options_.expected_batch_size > 0); !s.ok()) {
    return s;
  }
  try {
    return ApplyClipped(ClipAndSumPerSample(per_sample, params, options_.clip_norm), params);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("DP-SGD step: ", ErrorFirstLine(e)));
  }
}

absl::StatusOr<DpSgdStats> DpSgdStep::ApplyClipped(const ClippedGradients& clipped,
                                                   const std::vector<torch::Tensor>& params) {
  if (clipped.sums.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DP-SGD: ", clipped.sums.size(), " clipped sums for ", params.size(), " parameters"));
  }
  const auto n = static_cast<int64_t>(clipped.norms.size());
  if (n == 0 && !(options_.expected_batch_size > 0)) {
    return absl::InvalidArgumentError(
        "DP-SGD: a batch of no samples (only a fixed expected_batch_size can divide it)");
  }
  DpSgdStats stats;
  stats.samples = n;
  for (int64_t i = 0; i < n; ++i) {
    const double norm = clipped.norms[static_cast<size_t>(i)];
    if (!std::isfinite(norm)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DP-SGD: the gradient of sample ", i, " of the batch is not finite (norm ", norm, ")"));
    }
    if (norm > options_.clip_norm) ++stats.clipped;
    stats.max_sample_norm = std::max(stats.max_sample_norm, norm);
  }
  try {
    torch::NoGradGuard no_grad;
    const double divisor =
        options_.expected_batch_size > 0 ? options_.expected_batch_size : static_cast<double>(n);
    const double stddev = options_.noise_multiplier * options_.clip_norm;
    for (size_t k = 0; k < params.size(); ++k) {
      const torch::Tensor& p = params[k];
      torch::Tensor sum = clipped.sums[k].to(torch::kCPU, torch::kFloat32).contiguous().clone();
      noise_.Add(absl::MakeSpan(sum.data_ptr<float>(), static_cast<size_t>(sum.numel())), stddev);
      sum.div_(divisor);
      torch::Tensor g = sum.view(p.sizes()).to(p.device(), p.scalar_type());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(g);
      } else {
        p.mutable_grad() = g.clone();
      }
    }
    return stats;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("DP-SGD step: ", ErrorFirstLine(e)));
  }
}

}  // namespace shoal::training
