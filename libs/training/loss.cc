#include "libs/training/loss.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/task/task_file.h"

namespace shoal::training {
namespace {

bool OneOutputPerSample(const torch::Tensor& out) {
  return out.dim() == 1 || (out.dim() == 2 && out.size(1) == 1);
}

}  // namespace

torch::Tensor TaskLoss(common::v1::Loss loss, const torch::Tensor& out, const torch::Tensor& y,
                       int num_classes) {
  switch (loss) {
    case common::v1::LOSS_MSE:
      return torch::mse_loss(out, torch::one_hot(y, num_classes).to(out.scalar_type())) *
             num_classes;
    case common::v1::LOSS_BCE:
      if (OneOutputPerSample(out)) {
        return torch::binary_cross_entropy_with_logits(out.reshape({-1}), y.to(out.scalar_type()));
      }
      return torch::binary_cross_entropy_with_logits(
                 out, torch::one_hot(y, num_classes).to(out.scalar_type())) *
             num_classes;
    default:
      return torch::nn::functional::cross_entropy(out, y);
  }
}

torch::Tensor PredictClasses(const torch::Tensor& out) {
  if (OneOutputPerSample(out)) return out.reshape({-1}).gt(0).to(torch::kInt64);
  return out.argmax(1);
}

absl::Status CheckOutputFits(common::v1::Loss loss, const torch::Tensor& out, int num_classes) {
  const bool binary = loss == common::v1::LOSS_BCE && num_classes == 2;
  if (binary && out.numel() == 1 && OneOutputPerSample(out)) return absl::OkStatus();
  if (out.dim() == 2 && out.size(0) == 1 && out.size(1) == num_classes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the model's output for one sample has shape [", absl::StrJoin(out.sizes().vec(), ", "),
      "]; the data set has ", num_classes, " classes, so loss ",
      task::FriendlyEnumName(*common::v1::Loss_descriptor(), loss), " needs [1, ", num_classes, "]",
      binary ? " (or [1] or [1, 1])" : ""));
}

}  // namespace shoal::training
