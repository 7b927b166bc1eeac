// What record-level DP-SGD (privacy.dp level sample) costs a peer's training, measured against
// plain training of the same model on the same data in the same run (scripts/bench-privacy).
// For each built-in model: the trainer's time per step with plain SGD and with DP-SGD (Poisson
// batches of the same expected size, per-sample gradients, clipping, noise), best of --reps
// runs of --steps steps each, one LibTorch thread.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/training/loss.h"
#include "libs/training/models.h"
#include "libs/training/per_sample_grads.h"
#include "libs/training/trainer.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST's files");
ABSL_FLAG(std::string, models, "mlp,cnn", "built-in models to measure, comma-separated");
ABSL_FLAG(int, batch_size, 64, "samples per step (the Poisson batches' expected size)");
ABSL_FLAG(int, steps, 20, "steps per repetition");
ABSL_FLAG(int, reps, 3, "repetitions; the fastest counts (the machine may be shared)");

namespace shoal::training {
namespace {

TrainerOptions BenchOptions(const std::string& model, bool dp) {
  TrainerOptions o;
  o.spec.set_name("bench");
  o.spec.set_model(model);
  o.spec.set_batch_size(static_cast<uint32_t>(absl::GetFlag(FLAGS_batch_size)));
  o.spec.set_seed(1);
  o.spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  o.spec.mutable_optimizer()->set_learning_rate(0.05);
  o.spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  o.spec.mutable_dataset()->set_train_limit(8000);
  o.spec.mutable_dataset()->set_test_limit(100);
  if (dp) {
    common::v1::DpSpec& p = *o.spec.mutable_privacy()->mutable_dp();
    p.set_level(common::v1::DP_LEVEL_SAMPLE);
    p.set_clip_norm(1.0);
    p.set_noise_multiplier(1.1);
    p.set_delta(1e-5);
  }
  return o;
}

// Milliseconds per step, the fastest repetition; negative on failure (printed).
double MsPerStep(const std::string& model, bool dp, const RawDataset& train,
                 const RawDataset& test) {
  auto trainer = Trainer::Create(BenchOptions(model, dp), train, test);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s: %s\n", model.c_str(), trainer.status().ToString().c_str());
    return -1;
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  if (!(*trainer)->TrainBatches(2, nullptr).ok()) return -1;  // warm-up
  double best = 1e300;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const absl::Time start = absl::Now();
    auto stats = (*trainer)->TrainBatches(static_cast<uint32_t>(steps), nullptr);
    if (!stats.ok()) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), stats.status().ToString().c_str());
      return -1;
    }
    best = std::min(best, absl::ToDoubleMilliseconds(absl::Now() - start) / steps);
  }
  return best;
}

// Where a DP-SGD step's time goes: the per-sample gradients, then clipping and noise.
void Breakdown(const std::string& name) {
  auto net = MakeModel(name, 1);
  if (!net.ok()) return;
  std::unique_ptr<Model> model = WrapNet(*std::move(net));
  const int64_t n = absl::GetFlag(FLAGS_batch_size);
  torch::Tensor x = torch::rand({n, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {n}, torch::kInt64);
  auto grads = ChoosePerSampleGrads(*model, [](const torch::Tensor& out, const torch::Tensor& t) {
    return TaskLoss(common::v1::LOSS_CROSS_ENTROPY, out, t, 10);
  });
  if (!grads.ok()) return;
  std::vector<torch::Tensor> params;
  for (auto& [k, p] : model->NamedParameters()) params.push_back(p);
  double ghost = 1e300, materialised = 1e300;
  for (int r = 0; r < absl::GetFlag(FLAGS_steps); ++r) {
    absl::Time t0 = absl::Now();
    auto clipped = (*grads)->ClippedSum(x, y, 1.0);
    absl::Time t1 = absl::Now();
    auto per_sample = (*grads)->Compute(x, y);
    if (!clipped.ok() || !per_sample.ok()) return;
    ClipAndSumPerSample(*per_sample, params, 1.0);
    absl::Time t2 = absl::Now();
    ghost = std::min(ghost, absl::ToDoubleMilliseconds(t1 - t0));
    materialised = std::min(materialised, absl::ToDoubleMilliseconds(t2 - t1));
  }
  std::printf(
      "%-8s a batch's clipped sum: %.2f ms as DP-SGD computes it (%s), %.2f ms through "
      "every sample's gradient\n",
      name.c_str(), ghost, (*grads)->Kind().c_str(), materialised);
}

int Run() {
  if (!SetTorchThreads(1).ok()) return 1;
  auto train = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), Split::kTrain, 8000);
  auto test = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), Split::kTest, 100);
  if (!train.ok() || !test.ok()) {
    std::fprintf(stderr, "dp_sgd_bench: %s\n",
                 (train.ok() ? test.status() : train.status()).ToString().c_str());
    return 1;
  }
  std::printf("DP-SGD against plain SGD, batch %d, best of %d x %d steps, 1 LibTorch thread\n",
              absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_reps),
              absl::GetFlag(FLAGS_steps));
  std::printf("%-8s %14s %14s %8s\n", "model", "plain ms/step", "DP ms/step", "DP/plain");
  int failed = 0;
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());
  for (const std::string& model : models) {
    const double plain = MsPerStep(model, false, *train, *test);
    const double dp = MsPerStep(model, true, *train, *test);
    if (plain <= 0 || dp <= 0) {
      ++failed;
      continue;
    }
    std::printf("%-8s %14.2f %14.2f %7.2fx\n", model.c_str(), plain, dp, dp / plain);
  }
  for (const std::string& model : models) Breakdown(model);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace shoal::training

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shoal::training::Run();
}
