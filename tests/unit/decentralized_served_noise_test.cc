// The decentralized peer's served noise (services/peer_agent/modes/decentralized/served_noise.h):
// with privacy.dp at level peer the update a participant serves is its clipped update plus
// Gaussian noise, the full noise in the clear and a share with noise distributed. Statistics over
// many values with a fixed seed (as the aggregator's privacy test does).

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/peer_agent/modes/decentralized/served_noise.h"

namespace shoal::peer {
namespace {

using ::testing::HasSubstr;

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
TEST(ServedNoiseTest, AClearUpdateIsClippedAndCarriesTheFullNoise) {
  constexpr double kSigma = 1.5, kClip = 2;
  ServedNoise noise = ServedNoise::WithSeed(PeerDp(common::v1::DP_NOISE_CENTRAL, kSigma, kClip), 7);
  ASSERT_TRUE(noise.enabled());
  EXPECT_DOUBLE_EQ(noise.StddevFor(1), kSigma * kClip);
  EXPECT_DOUBLE_EQ(noise.StddevFor(8), kSigma * kClip);  // central: never a share
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
TEST(ServedNoiseTest, AMaskedUpdateCarriesItsShareOfTheNoise) {
  constexpr double kSigma = 2, kClip = 1;
  ServedNoise noise =
      ServedNoise::WithSeed(PeerDp(common::v1::DP_NOISE_DISTRIBUTED, kSigma, kClip), 9);
  EXPECT_DOUBLE_EQ(noise.StddevFor(4), 1.0);
  EXPECT_DOUBLE_EQ(noise.StddevFor(0), 2.0);  // taken as 1
  std::vector<float> delta(kValues, 0.0f);
  delta[0] = 3;  // norm 3: clipped to 1
  EXPECT_NEAR(noise.ApplyToDelta(absl::MakeSpan(delta), 4), 3, 1e-6);
  std::vector<double> added(delta.begin() + 1, delta.end());
  const Moments m = MomentsOf(added);
  EXPECT_NEAR(m.mean, 0, 4 * 1.0 / 200);
  EXPECT_NEAR(m.stddev, 1.0, 0.02);
}

TEST(ServedNoiseTest, NothingChangesWithoutPeerLevelDp) {
  common::v1::TaskSpec sample = PeerDp(common::v1::DP_NOISE_UNSPECIFIED, 1, 1);
  sample.mutable_privacy()->mutable_dp()->set_level(common::v1::DP_LEVEL_SAMPLE);
  for (const common::v1::TaskSpec& spec : {common::v1::TaskSpec(), sample}) {
    ServedNoise noise = ServedNoise::WithSeed(spec, 1);
    EXPECT_FALSE(noise.enabled());
    EXPECT_EQ(noise.StddevFor(3), 0);
    const tensor::FlatModel base = Model({0, 0, 0});
    tensor::FlatModel trained = Model({3, 4, 5});
    ASSERT_TRUE(noise.ApplyToModel(base, trained).ok());
    EXPECT_EQ(trained.values, (std::vector<float>{3, 4, 5}));
  }
}

TEST(ServedNoiseTest, RefusesWhatItCannotNoise) {
  ServedNoise noise = ServedNoise::WithSeed(PeerDp(common::v1::DP_NOISE_CENTRAL, 1, 1), 1);
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
