// What a peer does to its update for peer-level DP (services/peer_agent/update_privacy.h):
// nothing without privacy.dp; clipping only with central noise (the aggregator adds the
// noise); clipping and its 1/n share of the noise with distributed noise.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "services/peer_agent/update_privacy.h"

namespace shoal::peer {
namespace {

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
  auto privacy = UpdatePrivacy::Create(common::v1::TaskSpec());
  ASSERT_TRUE(privacy.ok());
  EXPECT_FALSE(privacy->enabled());
  EXPECT_EQ(privacy->Describe(), "");
  std::vector<float> v = {30, 40};
  privacy->Apply(absl::MakeSpan(v), 4);
  EXPECT_EQ(v, (std::vector<float>{30, 40}));
}

TEST(UpdatePrivacyTest, CentralNoiseOnlyClips) {
  auto privacy = UpdatePrivacy::Create(Spec(common::v1::DP_NOISE_CENTRAL));
  ASSERT_TRUE(privacy.ok());
  EXPECT_TRUE(privacy->enabled());
  std::vector<float> v = {30, 40};  // norm 50
  EXPECT_DOUBLE_EQ(privacy->Apply(absl::MakeSpan(v), 4), 50.0);
  EXPECT_NEAR(v[0], 1.2, 1e-5);
  EXPECT_NEAR(v[1], 1.6, 1e-5);
}

TEST(UpdatePrivacyTest, DistributedNoiseAddsTheShareOfNPeers) {
  UpdatePrivacy privacy = UpdatePrivacy::WithSeed(Spec(common::v1::DP_NOISE_DISTRIBUTED), 11);
  std::vector<float> v(100'000, 0.0F);
  privacy.Apply(absl::MakeSpan(v), 9);
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  // sigma x C / sqrt(n) = 1.5 x 2 / 3 = 1 per value (standard error of the estimate: 0.2 %).
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size())), 1.0, 0.02);
}

}  // namespace
}  // namespace shoal::peer
