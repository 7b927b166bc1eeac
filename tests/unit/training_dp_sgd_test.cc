// Record-level DP-SGD with real LibTorch on generated images: exact per-sample gradients (the
// layerwise fast path against one backward per sample, and both against the batch gradient),
// per-sample clipping, the noise's standard deviation, and the refusals.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/training/dp_sgd.h"
#include "libs/training/loss.h"
#include "libs/training/models.h"
#include "libs/training/per_sample_grads.h"
#include "libs/training/trainer.h"

namespace shoal::training {
namespace {

using ::testing::HasSubstr;

torch::Tensor CrossEntropy(const torch::Tensor& out, const torch::Tensor& y) {
  return TaskLoss(common::v1::LOSS_CROSS_ENTROPY, out, y, 10);
}

std::unique_ptr<Model> Built(const std::string& name) {
  auto net = MakeModel(name, 7);
  EXPECT_TRUE(net.ok()) << net.status();
  return WrapNet(*std::move(net));
}

struct Batch {
  torch::Tensor x;
  torch::Tensor y;
};

Batch MakeBatch(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::rand({n, 1, 28, 28}), torch::randint(0, 10, {n}, torch::kInt64)};
}

std::vector<torch::Tensor> Params(Model& model) {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : model.NamedParameters()) out.push_back(p);
  return out;
}

// ‖a − b‖ / ‖b‖.
double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

// The fastest of `reps` runs: the machine is shared, so the mean mostly measures the others.
double MillisPerBatch(PerSampleGrads& grads, const Batch& b, int reps) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(grads.Compute(b.x, b.y).ok());
    std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
    best = std::min(best, ms.count());
  }
  return best;
}

// One torch thread in every suite: the machine is shared, and the printed timings say so.
class OneThread : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetTorchThreads(1).ok()); }
};
class DpSgdTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetTorchThreads(1).ok()); }
};
using PerSampleGradsTest = OneThread;
using DpSgdStepTest = OneThread;

TEST_P(DpSgdTest, FastPathEqualsOneBackwardPerSampleAndSumsToTheBatchGradient) {
  std::unique_ptr<Model> model = Built(GetParam());
  ASSERT_TRUE(MakeLayerwisePerSampleGrads(*model, CrossEntropy).ok())
      << MakeLayerwisePerSampleGrads(*model, CrossEntropy).status();
  auto fast = ChoosePerSampleGrads(*model, CrossEntropy);
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ((*fast)->Kind(), "layerwise");
  std::unique_ptr<PerSampleGrads> loop = MakeLoopPerSampleGrads(*model, CrossEntropy);

  const Batch raw = MakeBatch(32, 3);
  const Batch b{model->PrepareInputs(raw.x), raw.y};
  auto fast_grads = (*fast)->Compute(b.x, b.y);
  auto loop_grads = loop->Compute(b.x, b.y);
  ASSERT_TRUE(fast_grads.ok()) << fast_grads.status();
  ASSERT_TRUE(loop_grads.ok()) << loop_grads.status();

  std::vector<torch::Tensor> params = Params(*model);
  for (torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();
  CrossEntropy(model->Forward(b.x), b.y).backward();
  const auto named = model->NamedParameters();
  ASSERT_EQ(fast_grads->size(), params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor& f = (*fast_grads)[k];
    EXPECT_EQ(f.size(0), 32);
    EXPECT_LT(RelativeError(f, (*loop_grads)[k]), 1e-5) << named[k].first;
    EXPECT_LT(RelativeError(f.mean(0), params[k].grad()), 1e-5) << named[k].first;
    // Not all rows alike: the rows are each sample's own.
    EXPECT_GT((f[0] - f[1]).norm().item<double>(), 0) << named[k].first;
  }
  // Computing leaves the parameters' gradients alone.
  const torch::Tensor before = params[0].grad().clone();
  ASSERT_TRUE((*fast)->Compute(b.x, b.y).ok());
  EXPECT_TRUE(torch::equal(before, params[0].grad()));

  if (GetParam() == "cnn") {
    const double fast_ms = MillisPerBatch(**fast, b, 3);
    const double loop_ms = MillisPerBatch(*loop, b, 3);
    std::printf(
        "per-sample gradients, cnn, batch of 32, 1 thread, best of 3: layerwise %.1f ms, loop %.1f "
        "ms (loop/layerwise %.1fx)\n",
        fast_ms, loop_ms, loop_ms / fast_ms);
  }
}

INSTANTIATE_TEST_SUITE_P(BuiltIn, DpSgdTest,
                         ::testing::Values("mlp", "cnn", "dp-cnn", "scatter-linear",
                                           "scatter-cnn"));

// A model whose forward is not a chain of layers, with a layer the fast path does not know.
class GatedNet final : public Net {
 public:
  GatedNet() {
    fc_ = register_module("fc", torch::nn::Linear(784, 10));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({10})));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(1);
    return norm_->forward(fc_->forward(x)) * torch::sigmoid(x.mean(1, true));
  }

 private:
  torch::nn::Linear fc_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
};

TEST_F(PerSampleGradsTest, AnyOtherModelTakesTheLoopWhichSumsToTheBatchGradient) {
  std::unique_ptr<Model> model = WrapNet(std::make_shared<GatedNet>());
  auto grads = ChoosePerSampleGrads(*model, CrossEntropy);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ((*grads)->Kind(), "loop");
  const Batch b = MakeBatch(8, 4);
  auto per_sample = (*grads)->Compute(b.x, b.y);
  ASSERT_TRUE(per_sample.ok()) << per_sample.status();
  CrossEntropy(model->Forward(b.x), b.y).backward();
  std::vector<torch::Tensor> params = Params(*model);
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_LT(RelativeError((*per_sample)[k].mean(0), params[k].grad()), 1e-5) << k;
  }
  EXPECT_THAT(MakeLayerwisePerSampleGrads(*model, CrossEntropy).status().message(),
              HasSubstr("not a chain"));
  EXPECT_FALSE((*grads)->Compute(b.x, b.y.narrow(0, 0, 5)).ok());
}

class NormNet final : public Net {
 public:
  NormNet() {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
    bn_ = register_module("bn", torch::nn::BatchNorm2d(4));
    fc_ = register_module("fc", torch::nn::Linear(4 * 26 * 26, 10));
  }
  torch::Tensor forward(torch::Tensor x) override {
    return fc_->forward(torch::relu(bn_->forward(conv_->forward(x))).flatten(1));
  }

 private:
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

TEST_F(PerSampleGradsTest, BatchNormIsRefusedNamingTheLayer) {
  std::unique_ptr<Model> model = WrapNet(std::make_shared<NormNet>());
  auto grads = ChoosePerSampleGrads(*model, CrossEntropy);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(grads.status().message(), HasSubstr("'bn'"));
  EXPECT_THAT(grads.status().message(), HasSubstr("BatchNorm2d"));
}

TEST_F(PerSampleGradsTest, AChainWithAnUnknownLayerIsNotTheFastPath) {
  auto chain = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Flatten(), torch::nn::Linear(784, 10), torch::nn::Dropout(0.5));
  class ChainNet final : public Net {
   public:
    explicit ChainNet(std::shared_ptr<torch::nn::SequentialImpl> c)
        : chain_(register_module("chain", torch::nn::Sequential(std::move(c)))) {}
    torch::Tensor forward(torch::Tensor x) override { return chain_->forward(x); }
    torch::nn::Sequential Layers() override { return chain_; }

   private:
    torch::nn::Sequential chain_;
  };
  std::unique_ptr<Model> model = WrapNet(std::make_shared<ChainNet>(chain));
  auto fast = MakeLayerwisePerSampleGrads(*model, CrossEntropy);
  ASSERT_FALSE(fast.ok());
  EXPECT_THAT(fast.status().message(), HasSubstr("layer 2 of the chain"));
  EXPECT_THAT(fast.status().message(), HasSubstr("Dropout"));
  auto chosen = ChoosePerSampleGrads(*model, CrossEntropy);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ((*chosen)->Kind(), "loop");
}

DpSgdStep MakeStep(double clip, double sigma, double expected_batch, uint64_t seed = 5) {
  DpSgdOptions o;
  o.clip_norm = clip;
  o.noise_multiplier = sigma;
  o.expected_batch_size = expected_batch;
  auto step = DpSgdStep::Create(o, privacy::GaussianNoise::FromSeed(seed));
  EXPECT_TRUE(step.ok()) << step.status();
  return *std::move(step);
}

// The sum over all parameters of (a − b)², square-rooted.
double Distance(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double sum = 0;
  for (size_t k = 0; k < a.size(); ++k) sum += (a[k] - b[k]).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

std::vector<torch::Tensor> Grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) out.push_back(p.grad().clone());
  return out;
}

TEST_F(DpSgdStepTest, ASampleWithAHugeGradientContributesAtMostClipNorm) {
  std::unique_ptr<Model> model = Built("mlp");
  auto grads = ChoosePerSampleGrads(*model, CrossEntropy);
  ASSERT_TRUE(grads.ok()) << grads.status();
  Batch b = MakeBatch(8, 6);
  b.x[0].mul_(1e4);  // sample 0's gradient is huge
  auto per_sample = (*grads)->Compute(b.x, b.y);
  ASSERT_TRUE(per_sample.ok()) << per_sample.status();
  std::vector<torch::Tensor> others;
  for (const torch::Tensor& g : *per_sample) others.push_back(g.narrow(0, 1, 7));

  const double clip = 0.5;
  std::vector<torch::Tensor> params = Params(*model);
  DpSgdStep step = MakeStep(clip, 0, /*expected_batch=*/1);  // the plain sum of clipped samples
  auto stats = step.Apply(*per_sample, params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->max_sample_norm, 100 * clip);
  EXPECT_GE(stats->clipped, 1);
  const std::vector<torch::Tensor> with_huge = Grads(params);
  ASSERT_TRUE(step.Apply(others, params).ok());
  const double contribution = Distance(with_huge, Grads(params));
  EXPECT_LE(contribution, clip * (1 + 1e-5));
  EXPECT_GT(contribution, clip * (1 - 1e-4));

  // The mean of clipped samples is within clip_norm, however large the gradients.
  DpSgdStep mean_step = MakeStep(1e-3, 0, 0);
  ASSERT_TRUE(mean_step.Apply(*per_sample, params).ok());
  const std::vector<torch::Tensor> zeros = [&] {
    std::vector<torch::Tensor> z;
    for (const torch::Tensor& p : params) z.push_back(torch::zeros_like(p));
    return z;
  }();
  EXPECT_LE(Distance(Grads(params), zeros), 1e-3 * (1 + 1e-5));
}

TEST_F(DpSgdStepTest, NoiseHasStddevNoiseMultiplierTimesClipNormOverTheExpectedBatch) {
  const int64_t d = 100000;
  std::vector<torch::Tensor> params = {torch::zeros({d / 100, 100})};
  std::vector<torch::Tensor> zero_grads = {torch::zeros({1, d / 100, 100})};
  for (double expected_batch : {1.0, 4.0}) {
    DpSgdStep step = MakeStep(/*clip=*/2.0, /*sigma=*/1.5, expected_batch);
    ASSERT_TRUE(step.Apply(zero_grads, params).ok());
    const torch::Tensor g = params[0].grad().to(torch::kDouble);
    const double want = 1.5 * 2.0 / expected_batch;
    // The estimate's relative error is about 1/√(2d) = 0.22%: 5% is over 20 of those.
    EXPECT_NEAR(g.std().item<double>(), want, 0.05 * want) << expected_batch;
    EXPECT_NEAR(g.mean().item<double>(), 0, 0.05 * want) << expected_batch;
  }
}

TEST_F(DpSgdStepTest, NoNoiseAndAHugeClipNormTrainLikePlainSgd) {
  std::unique_ptr<Model> dp_model = Built("cnn");
  std::unique_ptr<Model> plain_model = Built("cnn");
  auto grads = ChoosePerSampleGrads(*dp_model, CrossEntropy);
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<torch::Tensor> dp_params = Params(*dp_model);
  std::vector<torch::Tensor> plain_params = Params(*plain_model);
  torch::optim::SGD dp_sgd(dp_params, torch::optim::SGDOptions(0.05));
  torch::optim::SGD plain_sgd(plain_params, torch::optim::SGDOptions(0.05));
  DpSgdStep step = MakeStep(1e9, 0, 0);
  for (int i = 0; i < 3; ++i) {
    const Batch b = MakeBatch(16, 10 + i);
    auto per_sample = (*grads)->Compute(b.x, b.y);
    ASSERT_TRUE(per_sample.ok()) << per_sample.status();
    auto stats = step.Apply(*per_sample, dp_params);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->clipped, 0);
    dp_sgd.step();
    plain_sgd.zero_grad();
    CrossEntropy(plain_model->Forward(b.x), b.y).backward();
    plain_sgd.step();
  }
  std::unique_ptr<Model> untrained = Built("cnn");
  const std::vector<torch::Tensor> initial = Params(*untrained);
  for (size_t k = 0; k < dp_params.size(); ++k) {
    EXPECT_TRUE(torch::allclose(dp_params[k], plain_params[k], 1e-4, 1e-6)) << k;
    EXPECT_FALSE(torch::equal(dp_params[k], initial[k])) << k;  // it trained
  }
}

TEST_F(DpSgdStepTest, OptionsAreRefusedNamingTheField) {
  auto refused = [](double clip, double sigma, double batch) {
    DpSgdOptions o;
    o.clip_norm = clip;
    o.noise_multiplier = sigma;
    o.expected_batch_size = batch;
    return std::string(
        DpSgdStep::Create(o, privacy::GaussianNoise::FromSeed(1)).status().message());
  };
  EXPECT_THAT(refused(0, 1, 0), HasSubstr("clip_norm"));
  EXPECT_THAT(refused(-1, 1, 0), HasSubstr("clip_norm"));
  EXPECT_THAT(refused(NAN, 1, 0), HasSubstr("clip_norm"));
  EXPECT_THAT(refused(1, -0.5, 0), HasSubstr("noise_multiplier"));
  EXPECT_THAT(refused(1, INFINITY, 0), HasSubstr("noise_multiplier"));
  EXPECT_THAT(refused(1, 1, -32), HasSubstr("expected_batch_size"));
  EXPECT_EQ(refused(1, 0, 0), "");
}

TEST_F(DpSgdStepTest, MismatchedOrNonFiniteGradientsAreRefusedAndWriteNothing) {
  std::vector<torch::Tensor> params = {torch::zeros({3, 2}), torch::zeros({2})};
  DpSgdStep step = MakeStep(1, 0, 0);
  auto wrong_shape = step.Apply({torch::zeros({4, 3, 2}), torch::zeros({4, 3})}, params);
  EXPECT_THAT(wrong_shape.status().message(), HasSubstr("parameter 1"));
  auto too_few = step.Apply({torch::zeros({4, 3, 2})}, params);
  EXPECT_THAT(too_few.status().message(), HasSubstr("1 per-sample gradients for 2 parameters"));
  torch::Tensor bad = torch::zeros({4, 3, 2});
  bad[2][1][0] = NAN;
  auto non_finite = step.Apply({bad, torch::zeros({4, 2})}, params);
  EXPECT_THAT(non_finite.status().message(), HasSubstr("sample 2"));
  EXPECT_FALSE(params[0].grad().defined());
}

}  // namespace
}  // namespace shoal::training
