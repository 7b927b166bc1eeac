// libs/gossip: interpolation factors (constant, clock, loss, 0/0 guard), divergence scaling,
// clock update, the two mixing orders, consensus distance, and GossipSpec defaults/validation.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "libs/gossip/gossip_spec.h"
#include "libs/gossip/interpolation.h"

namespace shoal::gossip {
namespace {

using ::testing::HasSubstr;

GossipConfig Config(common::v1::Interpolation method, double constant = 0.5,
                    double divergence = 0) {
  GossipConfig c;
  c.interpolation = method;
  c.constant_factor = constant;
  c.divergence_threshold = divergence;
  return c;
}

TEST(InterpolationFactor, ConstantIgnoresState) {
  GossipConfig c = Config(common::v1::INTERPOLATION_CONSTANT, 0.3);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {10, 2.0}, {1000, 0.1}), 0.3);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {0, 0}, {0, 0}), 0.3);
}

TEST(InterpolationFactor, ClockTakesMoreFromAnOlderPeer) {
  GossipConfig c = Config(common::v1::INTERPOLATION_CLOCK);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {100, 1}, {300, 1}), 0.75);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {300, 1}, {100, 1}), 0.25);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {0, 1}, {5, 1}), 1.0);
  // 0/0: two fresh models are mixed half and half, not NaN.
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {0, 1}, {0, 1}), 0.5);
}

TEST(InterpolationFactor, LossTakesMoreWhenTheLocalModelIsWorse) {
  GossipConfig c = Config(common::v1::INTERPOLATION_LOSS);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 3.0}, {1, 1.0}), 0.75);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 1.0}, {1, 3.0}), 0.25);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.0}, {1, 0.0}), 0.5);  // 0/0 guard
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.0}, {1, 2.0}), 0.0);
}

TEST(InterpolationFactor, DivergenceScalesDownBelowTheThreshold) {
  GossipConfig c = Config(common::v1::INTERPOLATION_CONSTANT, 0.5, 0.2);
  // Above the threshold: unchanged.
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.5}, {1, 0.5}), 0.5);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.2}, {1, 0.5}), 0.5);
  // Below: f *= loss / threshold.
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.1}, {1, 0.5}), 0.25);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.05}, {1, 0.5}), 0.125);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(c, {1, 0.0}, {1, 0.5}), 0.0);
  // Applies to every method.
  GossipConfig clock = Config(common::v1::INTERPOLATION_CLOCK, 0.5, 0.2);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(clock, {100, 0.1}, {300, 0.5}), 0.375);
  // Threshold 0 = off.
  GossipConfig off = Config(common::v1::INTERPOLATION_CONSTANT, 0.5, 0);
  EXPECT_DOUBLE_EQ(*InterpolationFactor(off, {1, 0.0001}, {1, 0.5}), 0.5);
}

TEST(InterpolationFactor, RejectsUntrustedState) {
  GossipConfig c = Config(common::v1::INTERPOLATION_LOSS);
  EXPECT_EQ(InterpolationFactor(c, {1, 1}, {1, NAN}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InterpolationFactor(c, {1, 1}, {-5, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InterpolationFactor(c, {1, 1}, {INFINITY, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InterpolateClock, UsesTheSameFactor) {
  EXPECT_DOUBLE_EQ(InterpolateClock(0.5, 100, 300), 200);
  EXPECT_DOUBLE_EQ(InterpolateClock(0.0, 100, 300), 100);
  EXPECT_DOUBLE_EQ(InterpolateClock(1.0, 100, 300), 300);
  EXPECT_DOUBLE_EQ(InterpolateClock(0.25, 100, 300), 150);
}

TEST(Interpolate, MixesEveryValue) {
  std::vector<float> local = {0, 2, 4};
  const std::vector<float> peer = {4, 2, 0};
  ASSERT_TRUE(Interpolate(0.25, peer, absl::MakeSpan(local)).ok());
  EXPECT_THAT(local, ::testing::ElementsAre(1, 2, 3));
  EXPECT_FALSE(Interpolate(0.5, std::vector<float>{1}, absl::MakeSpan(local)).ok());
  EXPECT_FALSE(Interpolate(1.5, peer, absl::MakeSpan(local)).ok());
}

TEST(Interpolate, KeepingStepAddsTheWholeUpdate) {
  // before = 1, the step moved it to 0 (update -1), the peer holds 3, f = 0.5:
  // dpwa's order gives 0.5*3 + 0.5*0 = 1.5 (update halved); Shoal's gives 0.5*3 + 0.5*1 - 1 = 1.
  const std::vector<float> before = {1};
  const std::vector<float> peer = {3};
  std::vector<float> dpwa = {0};
  ASSERT_TRUE(Interpolate(0.5, peer, absl::MakeSpan(dpwa)).ok());
  EXPECT_FLOAT_EQ(dpwa[0], 1.5f);
  std::vector<float> shoal = {0};
  ASSERT_TRUE(InterpolateKeepingStep(0.5, peer, before, absl::MakeSpan(shoal)).ok());
  EXPECT_FLOAT_EQ(shoal[0], 1.0f);
  // With no step (after == before) both orders agree.
  std::vector<float> a = {1}, b = {1};
  ASSERT_TRUE(Interpolate(0.3, peer, absl::MakeSpan(a)).ok());
  ASSERT_TRUE(InterpolateKeepingStep(0.3, peer, before, absl::MakeSpan(b)).ok());
  EXPECT_FLOAT_EQ(a[0], b[0]);
}

TEST(Consensus, DistanceAndMean) {
  const std::vector<float> x = {0, 0}, y = {2, 0};
  std::vector<absl::Span<const float>> models = {x, y};
  // mean (1, 0); each is 1 away: sqrt((1 + 1) / 2) = 1.
  EXPECT_DOUBLE_EQ(*ConsensusDistance(models), 1.0);
  EXPECT_THAT(*MeanModel(models), ::testing::ElementsAre(1, 0));
  EXPECT_DOUBLE_EQ(*ConsensusDistance({x}), 0.0);
  const std::vector<float> z = {1};
  EXPECT_FALSE(ConsensusDistance({x, z}).ok());
  EXPECT_TRUE(AllFinite(x));
  EXPECT_FALSE(AllFinite(std::vector<float>{1, NAN}));
}

TEST(GossipSpec, DefaultsAreDpwas) {
  common::v1::GossipSpec spec;
  ApplyGossipDefaults(spec);
  EXPECT_DOUBLE_EQ(spec.fetch_probability(), 1.0);
  EXPECT_EQ(spec.timeout_ms(), 2500u);
  EXPECT_EQ(spec.interpolation(), common::v1::INTERPOLATION_CONSTANT);
  EXPECT_DOUBLE_EQ(spec.constant_factor(), 0.5);
  EXPECT_DOUBLE_EQ(spec.divergence_threshold(), 0.0);
  EXPECT_DOUBLE_EQ(spec.flow_control().initial(), 1000);
  EXPECT_DOUBLE_EQ(spec.flow_control().min(), 10);
  EXPECT_DOUBLE_EQ(spec.flow_control().max(), 1000);
  EXPECT_DOUBLE_EQ(spec.flow_control().success_bonus(), 10);
  EXPECT_DOUBLE_EQ(spec.flow_control().failure_penalty(), 100);
  EXPECT_DOUBLE_EQ(spec.flow_control().random_min(), 10);
  EXPECT_DOUBLE_EQ(spec.flow_control().random_max(), 1000);
  EXPECT_TRUE(ValidateGossipSpec(spec).ok());
  // Set values are kept.
  common::v1::GossipSpec set;
  set.set_fetch_probability(0);
  set.set_interpolation(common::v1::INTERPOLATION_LOSS);
  ApplyGossipDefaults(set);
  EXPECT_DOUBLE_EQ(set.fetch_probability(), 0.0);
  EXPECT_EQ(set.interpolation(), common::v1::INTERPOLATION_LOSS);
  GossipConfig c = ResolveGossipSpec(set);
  EXPECT_EQ(c.timeout, absl::Milliseconds(2500));
  EXPECT_EQ(c.interpolation, common::v1::INTERPOLATION_LOSS);
}

TEST(GossipSpec, ValidationNamesTheField) {
  struct Case {
    common::v1::GossipSpec spec;
    const char* error;
  };
  std::vector<Case> cases(7);
  cases[0].spec.set_fetch_probability(1.5);
  cases[0].error = "gossip.fetch_probability: must be in [0, 1], got 1.5";
  cases[1].spec.set_timeout_ms(0);
  cases[1].error = "gossip.timeout_ms: must be in 1..600000, got 0";
  cases[2].spec.set_constant_factor(-0.1);
  cases[2].error = "gossip.constant_factor: must be in [0, 1]";
  cases[3].spec.set_divergence_threshold(-1);
  cases[3].error = "gossip.divergence_threshold: must be >= 0";
  cases[4].spec.mutable_flow_control()->set_min(2000);
  cases[4].error = "gossip.flow_control.min: must be <= max";
  cases[5].spec.mutable_flow_control()->set_random_min(500);
  cases[5].spec.mutable_flow_control()->set_random_max(100);
  cases[5].error = "gossip.flow_control.random_min: must be <= random_max";
  cases[6].spec.set_interpolation(static_cast<common::v1::Interpolation>(42));
  cases[6].error = "gossip.interpolation: unsupported value 42";
  for (const Case& c : cases) {
    absl::Status s = ValidateGossipSpec(c.spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.error;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.error));
  }
  common::v1::GossipSpec nan;
  nan.set_fetch_probability(NAN);
  EXPECT_FALSE(ValidateGossipSpec(nan).ok());
}

}  // namespace
}  // namespace shoal::gossip
