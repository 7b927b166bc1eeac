// libs/privacy/dp_update.h: clipping an update to an L2 norm, and the Gaussian noise of
// peer-level DP (its spread, and that n peers' shares of distributed noise add up to the
// central noise). The statistics use a seeded generator; the bounds are several standard
// errors wide.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "libs/privacy/dp_update.h"

namespace shoal::privacy {
namespace {

// Sample mean and standard deviation.
std::pair<double, double> Moments(const std::vector<double>& xs) {
  double sum = 0;
  for (double x : xs) sum += x;
  const double mean = sum / static_cast<double>(xs.size());
  double sq = 0;
  for (double x : xs) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(xs.size() - 1))};
}

TEST(DpUpdateTest, ClipScalesALargeUpdateDownToTheNormAndKeepsItsDirection) {
  std::vector<float> v = {3, 4, 0, -12};  // norm 13
  const double norm = ClipToNorm(absl::MakeSpan(v), 1.3);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  EXPECT_LE(L2Norm(v), 1.3);
  EXPECT_NEAR(L2Norm(v), 1.3, 1e-6);
  EXPECT_NEAR(v[0], 0.3, 1e-6);
  EXPECT_NEAR(v[1], 0.4, 1e-6);
  EXPECT_NEAR(v[3], -1.2, 1e-6);
}

TEST(DpUpdateTest, ClipLeavesAnUpdateWithinTheNormAlone) {
  std::vector<float> v = {0.3F, 0.4F};
  const std::vector<float> before = v;
  EXPECT_NEAR(ClipToNorm(absl::MakeSpan(v), 1.0), 0.5, 1e-7);
  EXPECT_EQ(v, before);
}

TEST(DpUpdateTest, ClippedNormNeverExceedsTheBoundAfterFloatRounding) {
  // Many values: float rounding of the scaled values must not lift the norm over the bound.
  GaussianNoise noise = GaussianNoise::FromSeed(7);
  for (double bound : {0.1, 1.0, 3.7, 1000.0}) {
    std::vector<float> v(100'000, 0.0F);
    noise.Add(absl::MakeSpan(v), 5.0);
    ClipToNorm(absl::MakeSpan(v), bound);
    EXPECT_LE(L2Norm(v), bound) << bound;
  }
}

TEST(DpUpdateTest, NonFiniteUpdateIsLeftAsItIs) {
  std::vector<float> v = {1, std::nanf(""), 2};
  EXPECT_FALSE(std::isfinite(ClipToNorm(absl::MakeSpan(v), 1.0)));
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v[2], 2);
}

TEST(DpUpdateTest, NoiseHasZeroMeanAndTheAskedStandardDeviation) {
  GaussianNoise noise = GaussianNoise::FromSeed(1);
  std::vector<float> v(200'000, 0.0F);
  noise.Add(absl::MakeSpan(v), 2.5);
  const auto [mean, sd] = Moments(std::vector<double>(v.begin(), v.end()));
  // Standard errors: 2.5 / sqrt(2e5) = 0.0056 for the mean, 2.5 / sqrt(4e5) = 0.004 for sd.
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(sd, 2.5, 0.025);
}

TEST(DpUpdateTest, ZeroStddevAddsNothing) {
  GaussianNoise noise = GaussianNoise::FromSeed(1);
  std::vector<float> v = {1, 2, 3};
  noise.Add(absl::MakeSpan(v), 0);
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
}

TEST(DpUpdateTest, DistributedSharesOfNPeersSumToTheCentralNoise) {
  const double sigma = 1.1;
  const double clip = 0.5;
  const uint32_t peers = 8;
  EXPECT_DOUBLE_EQ(DistributedNoiseStddev(sigma, clip, peers), sigma * clip / std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(DistributedNoiseStddev(sigma, clip, 0), sigma * clip);  // 0 is taken as 1
  GaussianNoise noise = GaussianNoise::FromSeed(3);
  std::vector<double> sums(50'000, 0.0);
  std::vector<float> share(sums.size());
  for (uint32_t p = 0; p < peers; ++p) {
    std::fill(share.begin(), share.end(), 0.0F);
    noise.Add(absl::MakeSpan(share), DistributedNoiseStddev(sigma, clip, peers));
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += share[i];
  }
  const auto [mean, sd] = Moments(sums);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(sd, sigma * clip, sigma * clip * 0.03);  // 3 %: about 9 standard errors
}

TEST(DpUpdateTest, SystemEntropyGivesDifferentNoiseEachTime) {
  auto a = GaussianNoise::FromSystemEntropy();
  auto b = GaussianNoise::FromSystemEntropy();
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> x(4, 0.0F), y(4, 0.0F);
  a->Add(absl::MakeSpan(x), 1.0);
  b->Add(absl::MakeSpan(y), 1.0);
  EXPECT_NE(x, y);
}

}  // namespace
}  // namespace shoal::privacy
