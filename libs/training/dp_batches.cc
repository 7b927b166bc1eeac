#include "libs/training/dp_batches.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/training/loss.h"

namespace shoal::training {
absl::StatusOr<std::unique_ptr<DpSgdBatches>> DpSgdBatches::Create(const common::v1::TaskSpec& spec,
                                                                   Model& model, int num_classes,
                                                                   int64_t shard_size) {
  const common::v1::DpSpec& dp = spec.privacy().dp();
  DpSgdOptions options;
  options.clip_norm = dp.clip_norm();
  options.noise_multiplier = dp.noise_multiplier();
  options.expected_batch_size = static_cast<double>(spec.batch_size());
  if (absl::Status s = options.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("privacy.dp: ", s.message()));
  }
  SHOAL_ASSIGN_OR_RETURN(privacy::GaussianNoise noise, privacy::GaussianNoise::FromSystemEntropy());
  SHOAL_ASSIGN_OR_RETURN(DpSgdStep step, DpSgdStep::Create(options, noise));
  const common::v1::Loss kind = spec.loss();
  BatchLoss loss = [kind, num_classes](const torch::Tensor& out, const torch::Tensor& y) {
    return TaskLoss(kind, out, y, num_classes);
  };
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<PerSampleGrads> grads, ChoosePerSampleGrads(model, loss));
  SHOAL_ASSIGN_OR_RETURN(std::mt19937_64 sampler,
                         privacy::EngineFromSystemEntropy("DP-SGD's batch sampling"));
  const double q =
      shard_size <= 0
          ? 1.0
          : std::min(1.0, static_cast<double>(spec.batch_size()) / static_cast<double>(shard_size));
  return std::unique_ptr<DpSgdBatches>(
      new DpSgdBatches(model, std::move(loss), std::move(grads), std::move(step), q, sampler));
}

DpSgdBatches::DpSgdBatches(Model& model, BatchLoss loss, std::unique_ptr<PerSampleGrads> grads,
                           DpSgdStep step, double q, std::mt19937_64 sampler)
    : model_(model),
      loss_(std::move(loss)),
      grads_(std::move(grads)),
      step_(std::move(step)),
      q_(q),
      sampler_(sampler) {
  for (auto& [name, p] : model_.NamedParameters()) params_.push_back(p);
}

absl::StatusOr<DpBatchStats> DpSgdBatches::Step(const torch::Tensor& images,
                                                const torch::Tensor& labels) {
  DpBatchStats stats;
  try {
    const int64_t n = images.size(0);
    std::vector<int64_t> picked;
    std::bernoulli_distribution take(q_);
    for (int64_t i = 0; i < n; ++i) {
      if (take(sampler_)) picked.push_back(i);
    }
    stats.samples = static_cast<int64_t>(picked.size());
    ClippedGradients clipped;
    if (picked.empty()) {
      for (const torch::Tensor& p : params_) clipped.sums.push_back(torch::zeros_like(p));
    } else {
      torch::Tensor idx =
          torch::from_blob(picked.data(), {stats.samples}, torch::kInt64).to(images.device());
      torch::Tensor x = images.index_select(0, idx);
      torch::Tensor y = labels.index_select(0, idx);
      {
        torch::NoGradGuard no_grad;
        stats.loss = loss_(model_.Forward(x), y).item<double>();
      }
      SHOAL_ASSIGN_OR_RETURN(clipped, grads_->ClippedSum(x, y, step_.options().clip_norm));
    }
    SHOAL_ASSIGN_OR_RETURN(stats.clipping, step_.ApplyClipped(clipped, params_));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("DP-SGD batch: ", ErrorFirstLine(e)));
  }
  return stats;
}

std::string DpSgdBatches::Describe() const {
  return absl::StrCat("DP-SGD: Poisson batches at q ", q_, ", clip_norm ",
                      step_.options().clip_norm, ", noise_multiplier ",
                      step_.options().noise_multiplier, ", per-sample gradients ", grads_->Kind());
}

}  // namespace shoal::training
