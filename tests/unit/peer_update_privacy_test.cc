// What a peer does to its update for peer-level DP (services/peer_agent/update_privacy.h), in
// every mode: nothing without privacy.dp at level peer; with noise central, clipping only where an
// aggregator adds the noise, the full noise where nobody aggregates (a decentralized participant's
// served update); with noise distributed, clipping and the share of the noise for the number of
// updates summed. Statistics over many values with a fixed seed.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "services/peer_agent/update_privacy.h"

namespace shoal::peer {
namespace {

using ::testing::HasSubstr;
common::v1::TaskSpec Spec(common::v1::DpNoise noise) {
  common::v1::TaskSpec spec;
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_clip_norm(2.0);
  dp.set_noise_multiplier(1.5);
  dp.set_noise(noise);
  dp.set_delta(1e-5);
  return spec;
}

TEST(UpdatePrivacyTest, WithoutDpTheUpdateIsUntouched) {
  auto privacy = UpdatePrivacy::Create(common::v1::TaskSpec(), CentralNoise::kAtAggregator);
  ASSERT_TRUE(privacy.ok());
  EXPECT_FALSE(privacy->enabled());
  EXPECT_EQ(privacy->Describe(), "");
  std::vector<float> v = {30, 40};
  privacy->Apply(absl::MakeSpan(v), 4);
  EXPECT_EQ(v, (std::vector<float>{30, 40}));
}

TEST(UpdatePrivacyTest, CentralNoiseOnlyClips) {
  auto privacy =
      UpdatePrivacy::Create(Spec(common::v1::DP_NOISE_CENTRAL), CentralNoise::kAtAggregator);
  ASSERT_TRUE(privacy.ok());
  EXPECT_TRUE(privacy->enabled());
  std::vector<float> v = {30, 40};  // norm 50
  EXPECT_DOUBLE_EQ(privacy->Apply(absl::MakeSpan(v), 4), 50.0);
  EXPECT_NEAR(v[0], 1.2, 1e-5);
  EXPECT_NEAR(v[1], 1.6, 1e-5);
}

TEST(UpdatePrivacyTest, DistributedNoiseAddsTheShareOfNPeers) {
  UpdatePrivacy privacy = UpdatePrivacy::WithSeed(Spec(common::v1::DP_NOISE_DISTRIBUTED),
                                                  CentralNoise::kAtAggregator, 11);
  std::vector<float> v(100'000, 0.0F);
  privacy.Apply(absl::MakeSpan(v), 9);
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  // sigma x C / sqrt(n) = 1.5 x 2 / 3 = 1 per value (standard error of the estimate: 0.2 %).
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size())), 1.0, 0.02);
}

constexpr size_t kValues = 40000;

common::v1::TaskSpec PeerDp(common::v1::DpNoise noise, double sigma, double clip) {
  common::v1::TaskSpec spec;
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(noise);
  dp.set_noise_multiplier(sigma);
  dp.set_clip_norm(clip);
  dp.set_delta(1e-5);
  return spec;
}

tensor::FlatModel Model(std::vector<float> values) {
  tensor::FlatModel m;
  m.layout = *tensor::ModelLayout::Create({{"w", {static_cast<int64_t>(values.size())}}});
  m.values = std::move(values);
  return m;
}

struct Moments {
  double mean = 0;
  double stddev = 0;
};

Moments MomentsOf(const std::vector<double>& xs) {
  Moments m;
  for (double x : xs) m.mean += x;
  m.mean /= static_cast<double>(xs.size());
  for (double x : xs) m.stddev += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(m.stddev / static_cast<double>(xs.size() - 1));
  return m;
}

// In the clear every other participant sees the update itself: it carries the full σ·C, on top
// of the update clipped to C.
TEST(UpdatePrivacyTest, AClearUpdateIsClippedAndCarriesTheFullNoise) {
  constexpr double kSigma = 1.5, kClip = 2;
  UpdatePrivacy noise = UpdatePrivacy::WithSeed(PeerDp(common::v1::DP_NOISE_CENTRAL, kSigma, kClip),
                                                CentralNoise::kAtPeer, 7);
  ASSERT_TRUE(noise.enabled());
  EXPECT_DOUBLE_EQ(noise.NoiseStddev(1), kSigma * kClip);
  EXPECT_DOUBLE_EQ(noise.NoiseStddev(8), kSigma * kClip);  // central: never a share
  const tensor::FlatModel base = Model(std::vector<float>(kValues, 0.25f));
  // An update of norm 100 (0.5 per value): clipped to 2, i.e. 0.01 per value.
  tensor::FlatModel trained = Model(std::vector<float>(kValues, 0.75f));
  absl::StatusOr<double> norm = noise.ApplyToModel(base, trained);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_NEAR(*norm, 100, 1e-3);
  std::vector<double> added(kValues);
  for (size_t i = 0; i < kValues; ++i) added[i] = trained.values[i] - base.values[i] - 0.01;
  const Moments m = MomentsOf(added);
  // 40000 draws: the mean's error is σC/200, the stddev's about 0.35%.
  EXPECT_NEAR(m.mean, 0, 4 * kSigma * kClip / 200);
  EXPECT_NEAR(m.stddev, kSigma * kClip, 0.02 * kSigma * kClip);
  // The next round's draw is a fresh one.
  tensor::FlatModel again = Model(std::vector<float>(kValues, 0.75f));
  ASSERT_TRUE(noise.ApplyToModel(base, again).ok());
  EXPECT_NE(again.values, trained.values);
}

// Under secure aggregation only the sum of n masked updates is revealed: each carries a share
// N(0, (σC)²/n), so the sum carries σ·C.
TEST(UpdatePrivacyTest, AMaskedUpdateCarriesItsShareOfTheNoise) {
  constexpr double kSigma = 2, kClip = 1;
  UpdatePrivacy noise = UpdatePrivacy::WithSeed(
      PeerDp(common::v1::DP_NOISE_DISTRIBUTED, kSigma, kClip), CentralNoise::kAtPeer, 9);
  EXPECT_DOUBLE_EQ(noise.NoiseStddev(4), 1.0);
  EXPECT_DOUBLE_EQ(noise.NoiseStddev(0), 2.0);  // taken as 1
  std::vector<float> delta(kValues, 0.0f);
  delta[0] = 3;  // norm 3: clipped to 1
  EXPECT_NEAR(noise.Apply(absl::MakeSpan(delta), 4), 3, 1e-6);
  std::vector<double> added(delta.begin() + 1, delta.end());
  const Moments m = MomentsOf(added);
  EXPECT_NEAR(m.mean, 0, 4 * 1.0 / 200);
  EXPECT_NEAR(m.stddev, 1.0, 0.02);
}

TEST(UpdatePrivacyTest, NothingChangesWithoutPeerLevelDp) {
  common::v1::TaskSpec sample = PeerDp(common::v1::DP_NOISE_UNSPECIFIED, 1, 1);
  sample.mutable_privacy()->mutable_dp()->set_level(common::v1::DP_LEVEL_SAMPLE);
  for (const common::v1::TaskSpec& spec : {common::v1::TaskSpec(), sample}) {
    UpdatePrivacy noise = UpdatePrivacy::WithSeed(spec, CentralNoise::kAtPeer, 1);
    EXPECT_FALSE(noise.enabled());
    EXPECT_EQ(noise.NoiseStddev(3), 0);
    const tensor::FlatModel base = Model({0, 0, 0});
    tensor::FlatModel trained = Model({3, 4, 5});
    ASSERT_TRUE(noise.ApplyToModel(base, trained).ok());
    EXPECT_EQ(trained.values, (std::vector<float>{3, 4, 5}));
  }
}

TEST(UpdatePrivacyTest, RefusesWhatItCannotNoise) {
  UpdatePrivacy noise =
      UpdatePrivacy::WithSeed(PeerDp(common::v1::DP_NOISE_CENTRAL, 1, 1), CentralNoise::kAtPeer, 1);
  tensor::FlatModel trained = Model({1, 2, 3});
  EXPECT_THAT(noise.ApplyToModel(Model({0, 0}), trained).status().message(),
              HasSubstr("layout is not the base's"));
  trained.values[1] = NAN;
  EXPECT_THAT(noise.ApplyToModel(Model({0, 0, 0}), trained).status().message(),
              HasSubstr("not finite"));
  EXPECT_EQ(trained.values[0], 1);  // nothing changed
}

}  // namespace
}  // namespace shoal::peer
