#include "libs/training/dp_sgd.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/training/models.h"

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

// OK when per_sample[k] is [N, params[k] shape...] for every k, with the same N >= 1.
absl::Status CheckShapes(const std::vector<torch::Tensor>& per_sample,
                         const std::vector<torch::Tensor>& params) {
  if (params.empty() || per_sample.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DP-SGD: ", per_sample.size(), " per-sample gradients for ", params.size(), " parameters"));
  }
  const int64_t n = per_sample[0].dim() > 0 ? per_sample[0].size(0) : 0;
  if (n == 0) return absl::InvalidArgumentError("DP-SGD: a batch of no samples");
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
  if (absl::Status s = CheckShapes(per_sample, params); !s.ok()) return s;
  try {
    torch::NoGradGuard no_grad;
    const int64_t n = per_sample[0].size(0);
    // One row per sample, every parameter's gradient side by side: a fresh copy, clipped in
    // place row by row.
    std::vector<torch::Tensor> rows;
    rows.reserve(per_sample.size());
    for (const torch::Tensor& g : per_sample) {
      rows.push_back(g.reshape({n, -1}).to(torch::kCPU, torch::kFloat32));
    }
    torch::Tensor flat = torch::cat(rows, 1).contiguous();
    const int64_t d = flat.size(1);
    float* data = flat.data_ptr<float>();
    DpSgdStats stats;
    stats.samples = n;
    for (int64_t i = 0; i < n; ++i) {
      const double norm = privacy::ClipToNorm(absl::MakeSpan(data + i * d, static_cast<size_t>(d)),
                                              options_.clip_norm);
      if (!std::isfinite(norm)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DP-SGD: the gradient of sample ", i, " of the batch is not finite (norm ", norm, ")"));
      }
      if (norm > options_.clip_norm) ++stats.clipped;
      stats.max_sample_norm = std::max(stats.max_sample_norm, norm);
    }
    torch::Tensor sum = flat.sum(0).contiguous();
    noise_.Add(absl::MakeSpan(sum.data_ptr<float>(), static_cast<size_t>(d)),
               options_.noise_multiplier * options_.clip_norm);
    const double divisor =
        options_.expected_batch_size > 0 ? options_.expected_batch_size : static_cast<double>(n);
    sum.div_(divisor);
    int64_t offset = 0;
    for (const torch::Tensor& p : params) {
      torch::Tensor g =
          sum.narrow(0, offset, p.numel()).view(p.sizes()).to(p.device(), p.scalar_type());
      offset += p.numel();
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
