// The scattering features of scatter-linear and scatter-cnn (libs/training/scattering.h) on
// generated images: values against an independent implementation, the shapes, the group
// normalisation, and what a scattering transform must do (a half turn of the image turns its
// features; a shift of a pixel moves them little).

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "libs/training/models.h"
#include "libs/training/scattering.h"

namespace shoal::training {
namespace {

// sin(0.7 i) cos(0.4 j) + 0.1 i over an H x W grid, as [1, 1, H, W].
torch::Tensor Pattern(int64_t h, int64_t w) {
  const torch::Tensor i = torch::arange(h, torch::kFloat32).view({h, 1});
  const torch::Tensor j = torch::arange(w, torch::kFloat32).view({1, w});
  return (torch::sin(0.7 * i) * torch::cos(0.4 * j) + 0.1 * i).view({1, 1, h, w});
}

TEST(ScatteringTest, MatchesAnIndependentImplementation) {
  // Values of a PyTorch implementation of the same transform (spatial convolutions with the same
  // Morlet filters and the same subsampling, written apart from this one) on the same pattern.
  const torch::Tensor f = ScatteringFeatures(Pattern(28, 28));
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{1, 81, 7, 7}));
  struct Expected {
    int64_t channel, row, column;
    float value;
  };
  for (const Expected& e : std::vector<Expected>{{0, 3, 3, 1.079393f},
                                                 {5, 3, 3, 0.064692f},
                                                 {17, 1, 5, -0.993998f},
                                                 {40, 3, 3, 0.442536f},
                                                 {80, 6, 0, 0.537898f},
                                                 {10, 0, 6, -0.425488f}}) {
    EXPECT_NEAR(f[0][e.channel][e.row][e.column].item<float>(), e.value, 2e-4)
        << "channel " << e.channel << " at " << e.row << ", " << e.column;
  }
}

TEST(ScatteringTest, ShapesAndGroupNormalisation) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::rand({130, 2, 29, 30});  // more samples than one block
  const torch::Tensor f = ScatteringFeatures(x);
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{130, 162, 8, 8}));
  const torch::Tensor groups = f.reshape({130, 162 / kScatteringGroup, -1});
  const torch::Tensor variances = groups.var(2, /*unbiased=*/false);
  EXPECT_LT(groups.mean(2).abs().max().item<float>(), 1e-4);
  // Variance 1, except where a group's own is near the normalisation's epsilon (1e-5; second
  // order features of noise are tiny): then less.
  EXPECT_LT(variances.max().item<float>(), 1 + 1e-3);
  EXPECT_LT((variances.select(1, 0) - 1).abs().max().item<float>(), 1e-3);
  // A sample's features are its own: the same whether it is transformed alone or in a block.
  EXPECT_TRUE(
      torch::allclose(ScatteringFeatures(x.narrow(0, 129, 1)), f.narrow(0, 129, 1), 1e-5, 1e-5));
  EXPECT_EQ(ScatteringFeatures(torch::rand({0, 1, 28, 28})).sizes(),
            (std::vector<int64_t>{0, 81, 7, 7}));
  EXPECT_THROW(ScatteringFeatures(torch::rand({2, 28, 28})), c10::Error);
  EXPECT_THROW(ScatteringFeatures(torch::rand({2, 1, 8, 8})), c10::Error);
}

TEST(ScatteringTest, AHalfTurnOfTheImageTurnsItsFeatures) {
  // On 29 x 29 the low-pass samples (every 4th pixel from 0 to 28) map onto themselves under a
  // half turn, and a wavelet turned by pi has the same modulus.
  const torch::Tensor x = Pattern(29, 29);
  const torch::Tensor turned = ScatteringFeatures(torch::rot90(x, 2, {2, 3}));
  EXPECT_TRUE(torch::allclose(torch::rot90(ScatteringFeatures(x), 2, {2, 3}), turned, 1e-4, 1e-4));
}

TEST(ScatteringTest, AShiftOfAPixelMovesTheFeaturesLittle) {
  // Two blobs on an empty field, then the same field moved by one pixel, and another field.
  torch::manual_seed(9);
  torch::Tensor a = torch::zeros({1, 1, 28, 28});
  a.narrow(2, 8, 10).narrow(3, 6, 12).copy_(torch::rand({1, 1, 10, 12}));
  const torch::Tensor moved = torch::roll(a, {1}, {3});
  torch::Tensor other = torch::zeros({1, 1, 28, 28});
  other.narrow(2, 10, 10).narrow(3, 9, 12).copy_(torch::rand({1, 1, 10, 12}));
  const torch::Tensor fa = ScatteringFeatures(a);
  const double to_moved = (ScatteringFeatures(moved) - fa).norm().item<double>();
  const double to_other = (ScatteringFeatures(other) - fa).norm().item<double>();
  EXPECT_LT(to_moved, 0.3 * to_other) << to_moved << " against " << to_other;
  // The pixels themselves moved as far as the two fields are apart.
  EXPECT_GT((moved - a).norm().item<double>(), 0.5 * (other - a).norm().item<double>());
}

TEST(ScatteringTest, ScatterModelsTakeTheFeatures) {
  // Each scattering model and its parameter count: the linear classifier, and the CNN's two
  // convolutions and two linear layers.
  const std::vector<std::pair<std::string, int64_t>> models = {
      {"scatter-linear", 81 * 49 * 10 + 10},
      {"scatter-cnn", (81 * 9 * 16 + 16) + (16 * 9 * 32 + 32) + (512 * 32 + 32) + (32 * 10 + 10)}};
  const torch::Tensor x = torch::rand({4, 1, 28, 28});
  for (const auto& [name, expected_parameters] : models) {
    SCOPED_TRACE(name);
    auto net = MakeModel(name, 3);
    ASSERT_TRUE(net.ok()) << net.status();
    std::unique_ptr<Model> model = WrapNet(*std::move(net));
    const torch::Tensor features = model->PrepareInputs(x);
    EXPECT_EQ(features.sizes(), (std::vector<int64_t>{4, 81, 7, 7}));
    EXPECT_TRUE(torch::equal(features, ScatteringFeatures(x)));
    EXPECT_EQ(model->Forward(features).sizes(), (std::vector<int64_t>{4, 10}));
    int64_t parameters = 0;
    for (const auto& [unused, p] : model->NamedParameters()) parameters += p.numel();
    EXPECT_EQ(parameters, expected_parameters);
  }
  // Other models take the samples as they are.
  auto mlp = MakeModel("mlp", 3);
  ASSERT_TRUE(mlp.ok());
  EXPECT_TRUE(WrapNet(*std::move(mlp))->PrepareInputs(x).is_same(x));
}

}  // namespace
}  // namespace shoal::training
