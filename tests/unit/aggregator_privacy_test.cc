// Peer-level differential privacy in the aggregator's rounds (services/aggregator/
// round_privacy.h): every update weighs 1 and the round divides by the peers expected at the
// open (a fixed denominator, whoever pushed), central noise clips each update again on arrival
// and adds N(0, (sigma C)^2) per value to the sum, and rounds DP cannot take are refused.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "libs/privacy/dp_update.h"
#include "services/aggregator/round_privacy.h"
#include "tests/unit/aggregator_core_fixture.h"

namespace shoal::aggregator {
namespace {

common::v1::DpSpec Dp(common::v1::DpNoise noise, double clip, double sigma) {
  common::v1::DpSpec dp;
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(noise);
  dp.set_clip_norm(clip);
  dp.set_noise_multiplier(sigma);
  dp.set_delta(1e-5);
  return dp;
}

// The standard deviation of `values` and, in `mean_out`, their mean.
double SpreadOf(const std::vector<float>& values, double* mean_out) {
  double sum = 0;
  double sq = 0;
  for (float v : values) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(values.size());
  *mean_out = sum / n;
  return std::sqrt(sq / n - *mean_out * *mean_out);
}

class AggregatorPrivacyTest : public AggregatorCoreFixture {
 protected:
  absl::Status OpenDp(std::vector<std::string> peers, common::v1::DpSpec dp,
                      v1::AggregationSettings aggregation = {}) {
    OpenRoundParams p{"t", 1, 0, std::move(peers), 0};
    p.aggregation = std::move(aggregation);
    p.dp = std::move(dp);
    return core_->OpenRound(p);
  }
  // The published version's delta from the base.
  std::vector<float> PublishedDelta(const tensor::FlatModel& base) {
    auto model = core_->GetModel("t", std::nullopt);
    EXPECT_TRUE(model.ok());
    std::vector<float> delta(base.values.size());
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = model->model->values[i] - base.values[i];
    return delta;
  }
};

TEST_F(AggregatorPrivacyTest, UpdatesWeighOneAndTheRoundDividesByTheExpectedPeers) {
  PutBase();
  const tensor::FlatModel base = Filled([](size_t i) { return 1.0f * i; });
  // Distributed noise at sigma 0: the aggregator adds no noise (not even the missing peer's
  // share), so the result is exact. Clip far above the updates' norms: the aggregator does not
  // clip either (the peers did).
  ASSERT_TRUE(OpenDp({"a", "b", "c"}, Dp(common::v1::DP_NOISE_DISTRIBUTED, 1e6, 0.0)).ok());
  const tensor::FlatModel d1 = Filled([](size_t i) { return 1.0f + i; });
  const tensor::FlatModel d2 = Filled([](size_t i) { return -2.0f * i; });
  // Sample counts 1 and 30: a weighted mean would lean to b; DP must not.
  ASSERT_TRUE(PushModel(Meta("a", 1), d1).ok());
  ASSERT_TRUE(PushModel(Meta("b", 30), d2).ok());
  auto result = core_->CloseRound("t", 1);  // c never pushed
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->contributors.size(), 2u);
  const std::vector<float> delta = PublishedDelta(base);
  for (size_t i = 0; i < delta.size(); ++i) {
    EXPECT_FLOAT_EQ(delta[i], (d1.values[i] + d2.values[i]) / 3) << i;  // / 3, not / 2
  }
}

TEST_F(AggregatorPrivacyTest, CentralNoiseClipsEachUpdateAgainOnArrival) {
  PutBase();
  const tensor::FlatModel base = Filled([](size_t i) { return 1.0f * i; });
  // sigma 0: no noise, so the clipping shows exactly.
  ASSERT_TRUE(OpenDp({"a", "b"}, Dp(common::v1::DP_NOISE_CENTRAL, 1.0, 0.0)).ok());
  tensor::FlatModel d1 = Filled([](size_t i) { return 10.0f + i; });             // far over norm 1
  tensor::FlatModel d2 = Filled([](size_t i) { return i == 0 ? 0.5f : 0.0f; });  // within it
  ASSERT_TRUE(PushModel(Meta("a", 5), d1).ok());
  ASSERT_TRUE(PushModel(Meta("b", 5), d2).ok());
  ASSERT_TRUE(core_->CloseRound("t", 1).ok());
  std::vector<float> clipped = d1.values;
  privacy::ClipToNorm(absl::MakeSpan(clipped), 1.0);
  const std::vector<float> delta = PublishedDelta(base);
  for (size_t i = 0; i < delta.size(); ++i) {
    EXPECT_NEAR(delta[i], (clipped[i] + d2.values[i]) / 2, 1e-5) << i;
  }
}

TEST_F(AggregatorPrivacyTest, CentralNoiseHasTheCalibratedSpread) {
  const auto layout = *tensor::ModelLayout::Create({{"w", {4000}}});
  const tensor::FlatModel base = Filled([](size_t) { return 0.0f; }, layout);
  ASSERT_TRUE(core_->PutModel("t", 0, base).ok());
  const double sigma = 0.8;
  const double clip = 2.5;
  ASSERT_TRUE(OpenDp({"a", "b"}, Dp(common::v1::DP_NOISE_CENTRAL, clip, sigma)).ok());
  const tensor::FlatModel zero = Filled([](size_t) { return 0.0f; }, layout);
  ASSERT_TRUE(PushModel(Meta("a", 1), zero).ok());
  ASSERT_TRUE(PushModel(Meta("b", 1), zero).ok());
  ASSERT_TRUE(core_->CloseRound("t", 1).ok());
  // The published delta is noise / 2: standard deviation sigma x clip / 2 = 1.0.
  double mean = 0;
  const double sd = SpreadOf(PublishedDelta(base), &mean);
  // Standard errors with 4000 values: 0.016 for the mean, 0.011 for sd.
  EXPECT_NEAR(mean, 0.0, 0.08);
  EXPECT_NEAR(sd, sigma * clip / 2, 0.07);
}

TEST_F(AggregatorPrivacyTest, DistributedNoiseOfAMissingPeerIsAddedByTheAggregator) {
  EXPECT_DOUBLE_EQ(MissingNoiseStddev(Dp(common::v1::DP_NOISE_DISTRIBUTED, 2, 3), 4, 4), 0);
  EXPECT_DOUBLE_EQ(MissingNoiseStddev(Dp(common::v1::DP_NOISE_DISTRIBUTED, 2, 3), 4, 3), 3);
  EXPECT_DOUBLE_EQ(MissingNoiseStddev(Dp(common::v1::DP_NOISE_CENTRAL, 2, 3), 4, 3), 6);
  const auto layout = *tensor::ModelLayout::Create({{"w", {4000}}});
  const tensor::FlatModel base = Filled([](size_t) { return 0.0f; }, layout);
  ASSERT_TRUE(core_->PutModel("t", 0, base).ok());
  // Four expected, three push zeros (as if their own shares cancelled): the sum must still carry
  // the fourth's share, N(0, (sigma C)^2 / 4); published / 4: sd 2 x 2 / 2 / 4 = 0.5.
  ASSERT_TRUE(OpenDp({"a", "b", "c", "d"}, Dp(common::v1::DP_NOISE_DISTRIBUTED, 2, 2)).ok());
  const tensor::FlatModel zero = Filled([](size_t) { return 0.0f; }, layout);
  for (const char* peer : {"a", "b", "c"}) ASSERT_TRUE(PushModel(Meta(peer, 1), zero).ok());
  ASSERT_TRUE(core_->CloseRound("t", 1).ok());
  double mean = 0;
  const double sd = SpreadOf(PublishedDelta(base), &mean);
  // Standard errors with 4000 values: 0.008 for the mean, 0.006 for sd.
  EXPECT_NEAR(mean, 0.0, 0.04);
  EXPECT_NEAR(sd, 0.5, 0.035);
}

TEST_F(AggregatorPrivacyTest, RoundsDpCannotTakeAreRefused) {
  PutBase();
  const common::v1::DpSpec dp = Dp(common::v1::DP_NOISE_CENTRAL, 1.0, 1.0);
  absl::Status median =
      OpenDp({"a", "b", "c"}, dp, StrategySettings(common::v1::AGGREGATION_MEDIAN));
  EXPECT_EQ(median.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(median.message(), ::testing::HasSubstr("the aggregation must be mean"));
  common::v1::DpSpec bad = dp;
  bad.set_clip_norm(0);
  EXPECT_EQ(OpenDp({"a"}, bad).code(), absl::StatusCode::kInvalidArgument);
  OpenRoundParams late{"t", 1, 0, {"a"}, 0};
  late.late_peers = {"z"};
  late.dp = dp;
  EXPECT_EQ(core_->OpenRound(late).code(), absl::StatusCode::kInvalidArgument);
}

// On a tree a cluster's round clips (central noise) and weighs each update 1, and its partial
// sum carries no noise: only the root adds it.
TEST_F(AggregatorPrivacyTest, AClustersPartialSumIsItsClippedUpdatesWithoutNoise) {
  PutBase();
  OpenRoundParams p{"t", 1, 0, {"a", "b", "c"}, 0};
  p.parent.set_address("127.0.0.1:1");
  p.parent.set_child("leaf");
  p.dp = Dp(common::v1::DP_NOISE_CENTRAL, 1.0, 5.0);  // noise that would show at once
  EXPECT_EQ(core_->OpenRound(p).code(), absl::StatusCode::kInvalidArgument);  // no round peers
  p.dp_round_peers = 2;  // fewer than its own peers
  EXPECT_EQ(core_->OpenRound(p).code(), absl::StatusCode::kInvalidArgument);
  p.dp_round_peers = 10;
  ASSERT_TRUE(core_->OpenRound(p).ok());
  const tensor::FlatModel d1 = Filled([](size_t i) { return 10.0f + i; });  // far over norm 1
  const tensor::FlatModel d2 = Filled([](size_t i) { return i == 0 ? 0.5f : 0.0f; });
  ASSERT_TRUE(PushModel(Meta("a", 3), d1).ok());
  ASSERT_TRUE(PushModel(Meta("b", 40), d2).ok());
  auto partial = core_->ClosePartial("t", 1);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ((*partial)->sum.count, 2u);
  EXPECT_DOUBLE_EQ((*partial)->sum.total_weight, 2.0);  // 1 each, not 3 + 40
  std::vector<float> clipped = d1.values;
  privacy::ClipToNorm(absl::MakeSpan(clipped), 1.0);
  for (size_t i = 0; i < clipped.size(); ++i) {
    ASSERT_NEAR((*partial)->sum.sum[i], clipped[i] + d2.values[i], 1e-6) << i;
  }
}

}  // namespace
}  // namespace shoal::aggregator
