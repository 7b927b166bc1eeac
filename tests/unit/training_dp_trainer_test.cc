// The trainer with record-level DP-SGD (TaskSpec.privacy.dp level sample, dp_batches.h) on real
// Fashion-MNIST with real LibTorch: Poisson batches of batch_size samples on average, each
// step's change bounded by clip_norm, an empty batch taking the noise alone, and a model
// trained privately still learning. And the fast path's clipped sum (ghost norms for Linear
// layers, no per-sample tensor) against clipping every sample's own gradient.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/dp_update.h"
#include "libs/training/dp_sgd.h"
#include "libs/training/loss.h"
#include "libs/training/models.h"
#include "libs/training/per_sample_grads.h"
#include "libs/training/trainer.h"

namespace shoal::training {
namespace {

const char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

struct DpData {
  RawDataset train;
  RawDataset test;
};

const DpData& LoadedOnce() {
  static const DpData* data = [] {
    auto train = LoadFashionMnist(kFashionDir, Split::kTrain, 4000);
    auto test = LoadFashionMnist(kFashionDir, Split::kTest, 1000);
    EXPECT_TRUE(train.ok() && test.ok());
    return new DpData{train.ok() ? *std::move(train) : RawDataset{},
                      test.ok() ? *std::move(test) : RawDataset{}};
  }();
  return *data;
}

TrainerOptions DpOptions(double clip, double sigma, double lr = 0.5) {
  TrainerOptions o;
  o.spec.set_name("t");
  o.spec.set_model("mlp");
  o.spec.set_batch_size(50);
  o.spec.set_seed(3);
  o.spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  o.spec.mutable_optimizer()->set_learning_rate(lr);
  o.spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  common::v1::DpSpec& dp = *o.spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_SAMPLE);
  dp.set_clip_norm(clip);
  dp.set_noise_multiplier(sigma);
  dp.set_delta(1e-5);
  o.shard = {0, 2};  // 2000 training samples: q = 50 / 2000
  return o;
}

std::unique_ptr<Trainer> DpTrainer(const TrainerOptions& o) {
  auto t = Trainer::Create(o, LoadedOnce().train, LoadedOnce().test);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

double L2Distance(const tensor::FlatModel& a, const tensor::FlatModel& b) {
  double sum = 0;
  for (size_t i = 0; i < a.values.size(); ++i) {
    const double d = static_cast<double>(a.values[i]) - b.values[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}

torch::Tensor GhostLoss(const torch::Tensor& out, const torch::Tensor& y) {
  return TaskLoss(common::v1::LOSS_CROSS_ENTROPY, out, y, 10);
}

// A chain whose first Linear applies to every row of the image (28 positions per sample), so
// the ghost norm takes its general form, with a convolution after it.
class RowsNet final : public Net {
 public:
  RowsNet()
      : chain_(register_module(
            "chain",
            torch::nn::Sequential(torch::nn::Linear(28, 12), torch::nn::ReLU(),
                                  torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)),
                                  torch::nn::Flatten(), torch::nn::Linear(4 * 26 * 10, 10)))) {}
  torch::Tensor forward(torch::Tensor x) override { return chain_->forward(x); }
  torch::nn::Sequential Layers() override { return chain_; }

 private:
  torch::nn::Sequential chain_;
};

class DpTrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetTorchThreads(1).ok()); }
};

TEST_F(DpTrainerTest, EachStepMovesAtMostLearningRateTimesClipNormPerExpectedSample) {
  const double clip = 0.01, lr = 0.5;
  std::unique_ptr<Trainer> t = DpTrainer(DpOptions(clip, /*sigma=*/0, lr));
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->train_size(), 2000u);
  uint64_t drawn = 0;
  for (int step = 0; step < 8; ++step) {
    auto before = t->GetParameters();
    ASSERT_TRUE(before.ok());
    auto stats = t->TrainBatches(1, nullptr);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->batches, 1u);
    drawn += stats->samples;
    auto after = t->GetParameters();
    ASSERT_TRUE(after.ok());
    // The step's gradient: at most `samples` clipped gradients over the expected batch of 50.
    const double bound = lr * clip * static_cast<double>(stats->samples) / 50;
    EXPECT_LE(L2Distance(*before, *after), bound * (1 + 1e-4) + 1e-7) << step;
  }
  // Poisson batches: 8 x 50 = 400 samples expected (standard deviation about 20).
  EXPECT_GT(drawn, 250u);
  EXPECT_LT(drawn, 550u);
}

TEST_F(DpTrainerTest, AnEmptyPoissonBatchStepsWithTheNoiseAlone) {
  std::vector<torch::Tensor> params = {torch::zeros({400, 250})};
  std::vector<torch::Tensor> none = {torch::zeros({0, 400, 250})};
  DpSgdOptions o;
  o.clip_norm = 2;
  o.noise_multiplier = 1;
  o.expected_batch_size = 4;
  auto step = DpSgdStep::Create(o, privacy::GaussianNoise::FromSeed(9));
  ASSERT_TRUE(step.ok()) << step.status();
  auto stats = step->Apply(none, params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->samples, 0);
  // Noise of stddev sigma x clip / expected batch = 0.5 (within 5%: 100,000 draws).
  EXPECT_NEAR(params[0].grad().std().item<double>(), 0.5, 0.025);
  // Without a fixed expected batch there is nothing to divide by: refused.
  o.expected_batch_size = 0;
  auto unscaled = DpSgdStep::Create(o, privacy::GaussianNoise::FromSeed(9));
  ASSERT_TRUE(unscaled.ok());
  EXPECT_THAT(unscaled->Apply(none, params).status().message(),
              ::testing::HasSubstr("a batch of no samples"));
}

TEST_F(DpTrainerTest, APrivateModelStillLearns) {
  // sigma 1.1, clip 1: the noise per step is 1.1 / 50 per coordinate of the mean gradient.
  std::unique_ptr<Trainer> t = DpTrainer(DpOptions(/*clip=*/1.0, /*sigma=*/1.1, /*lr=*/0.5));
  ASSERT_NE(t, nullptr);
  auto before = t->Evaluate();
  ASSERT_TRUE(before.ok());
  auto stats = t->TrainBatches(80, nullptr);  // two epochs of the 2000 samples on average
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(std::isfinite(stats->mean_loss));
  auto after = t->Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_GT(after->accuracy(), 0.6) << "before " << before->accuracy();
  EXPECT_GT(after->accuracy(), before->accuracy() + 0.3);
}

TEST_F(DpTrainerTest, TheFastClippedSumEqualsClippingEverySamplesOwnGradient) {
  for (const std::string name : {"mlp", "cnn", "rows"}) {
    std::unique_ptr<Model> model;
    if (name == "rows") {
      model = WrapNet(std::make_shared<RowsNet>());
    } else {
      auto net = MakeModel(name, 4);
      ASSERT_TRUE(net.ok()) << net.status();
      model = WrapNet(*std::move(net));
    }
    auto fast = MakeLayerwisePerSampleGrads(*model, GhostLoss);
    ASSERT_TRUE(fast.ok()) << name << ": " << fast.status();
    torch::manual_seed(21);
    torch::Tensor x = torch::rand({12, 1, 28, 28});
    torch::Tensor y = torch::randint(0, 10, {12}, torch::kInt64);
    x[3].mul_(50);  // one sample far above the clip norm, the others around it
    std::vector<torch::Tensor> params;
    for (auto& [k, p] : model->NamedParameters()) params.push_back(p);
    auto per_sample = (*fast)->Compute(x, y);
    ASSERT_TRUE(per_sample.ok()) << per_sample.status();
    const ClippedGradients want = ClipAndSumPerSample(*per_sample, params, 0.5);
    auto got = (*fast)->ClippedSum(x, y, 0.5);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->norms.size(), 12u);
    int clipped = 0;
    for (size_t i = 0; i < 12; ++i) {
      EXPECT_NEAR(got->norms[i], want.norms[i], 1e-4 * want.norms[i]) << name << " sample " << i;
      if (want.norms[i] > 0.5) ++clipped;
    }
    EXPECT_GE(clipped, 1) << name;
    ASSERT_EQ(got->sums.size(), params.size());
    for (size_t k = 0; k < params.size(); ++k) {
      const double err = (got->sums[k] - want.sums[k]).norm().item<double>() /
                         std::max(want.sums[k].norm().item<double>(), 1e-30);
      EXPECT_LT(err, 1e-4) << name << " parameter " << k;
    }
  }
}

}  // namespace
}  // namespace shoal::training
