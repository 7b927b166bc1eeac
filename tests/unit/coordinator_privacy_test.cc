// The differential privacy budget of federated-sync tasks in the coordinator
// (services/coordinator/privacy_budget.h): one charge per round opened, with the accountant's
// values computed independently here; kept across a restart and charged again for a round that
// runs again; a task that stops, completed, before a round that would pass its target; and at
// level sample, round_batches DP-SGD steps per round at batch_size over the smallest shard the
// peers reported, the round waiting for their data reports.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "libs/privacy/rdp_accountant.h"
#include "services/coordinator/peer_data.h"
#include "services/coordinator/privacy_budget.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator::core_testing {
namespace {

using ::testing::HasSubstr;

constexpr double kSigma = 1.0;
constexpr double kDelta = 1e-5;

common::v1::TaskSpec DpSpec(const std::string& name, uint32_t rounds,
                            std::optional<double> target = std::nullopt) {
  common::v1::TaskSpec spec = Spec(name, 1, rounds);
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_clip_norm(0.5);
  dp.set_noise_multiplier(kSigma);
  dp.set_noise(common::v1::DP_NOISE_CENTRAL);
  dp.set_delta(kDelta);
  if (target) dp.set_target_epsilon(*target);
  return spec;
}

// epsilon after `rounds` rounds of every peer (q = 1), from a fresh accountant.
double EpsilonAfter(int rounds) {
  auto accountant = privacy::RdpAccountant::Create();
  EXPECT_TRUE(accountant.ok());
  EXPECT_TRUE(accountant->AddSteps(1.0, kSigma, rounds).ok());
  return accountant->Spent(kDelta)->epsilon;
}

TEST(PrivacyBudgetTest, ChargesMatchAnIndependentAccountant) {
  common::v1::TaskSpec spec = DpSpec("t", 10);
  v1::PrivacyStatus privacy;
  InitPrivacyStatus(spec, privacy);
  EXPECT_EQ(privacy.epsilon(), 0);
  EXPECT_EQ(privacy.delta(), kDelta);
  EXPECT_EQ(privacy.rdp_orders_size(), privacy.rdp_size());
  for (int r = 1; r <= 3; ++r) {
    ASSERT_TRUE(ChargeRound(spec, RoundCharge{1.0, 1}, privacy).ok());
    EXPECT_NEAR(privacy.epsilon(), EpsilonAfter(r), 1e-9) << r;
    EXPECT_EQ(privacy.rounds(), static_cast<uint64_t>(r));
  }
  EXPECT_DOUBLE_EQ(privacy.sampling_rate(), 1.0);
  EXPECT_DOUBLE_EQ(RoundSamplingRate(2, 8), 0.25);
  EXPECT_DOUBLE_EQ(RoundSamplingRate(3, 3), 1.0);
}

TEST(PrivacyBudgetTest, ARoundThatWouldPassTheTargetIsNamed) {
  // A target between epsilon after 2 and after 3 rounds: 2 rounds fit, the third does not.
  const double target = (EpsilonAfter(2) + EpsilonAfter(3)) / 2;
  common::v1::TaskSpec spec = DpSpec("t", 10, target);
  v1::PrivacyStatus privacy;
  InitPrivacyStatus(spec, privacy);
  for (uint64_t round = 1; round <= 2; ++round) {
    auto over = BudgetExceededBy(spec, privacy, round, RoundCharge{1.0, 1});
    ASSERT_TRUE(over.ok());
    EXPECT_FALSE(over->has_value()) << round;
    ASSERT_TRUE(ChargeRound(spec, RoundCharge{1.0, 1}, privacy).ok());
  }
  EXPECT_EQ(privacy.rounds_left(), 0u);
  auto over = BudgetExceededBy(spec, privacy, 3, RoundCharge{1.0, 1});
  ASSERT_TRUE(over.ok());
  ASSERT_TRUE(over->has_value());
  EXPECT_THAT(**over, HasSubstr("privacy budget reached"));
  EXPECT_THAT(**over, HasSubstr("round 3 would take it to"));
  EXPECT_THAT(**over, HasSubstr("over target_epsilon"));
}

common::v1::TaskSpec SampleDpSpec(const std::string& name, uint32_t rounds,
                                  std::optional<double> target = std::nullopt) {
  common::v1::TaskSpec spec = DpSpec(name, rounds, target);
  spec.mutable_privacy()->mutable_dp()->set_level(common::v1::DP_LEVEL_SAMPLE);
  spec.mutable_privacy()->mutable_dp()->clear_noise();
  spec.set_batch_size(32);
  spec.set_round_batches(5);
  return spec;
}

// epsilon after `steps` DP-SGD steps at sampling rate q, from a fresh accountant.
double EpsilonAfterSteps(double q, int steps) {
  auto accountant = privacy::RdpAccountant::Create();
  EXPECT_TRUE(accountant.ok());
  EXPECT_TRUE(accountant->AddSteps(q, kSigma, steps).ok());
  return accountant->Spent(kDelta)->epsilon;
}

v1::DataReport Samples(uint64_t train) {
  v1::DataReport report;
  report.set_train_samples(train);
  report.set_test_samples(10);
  return report;
}

TEST(PrivacyBudgetTest, SampleLevelChargesRoundBatchesStepsAtTheSmallestShardsRate) {
  common::v1::TaskSpec spec = SampleDpSpec("t", 10);
  v1::TaskStatus status;
  ASSERT_TRUE(RecordPeerData(status, "a", Samples(3200)).ok());
  // Peer b has not reported: its sampling rate is unknown, so the round cannot be charged.
  EXPECT_FALSE(RoundChargeOf(spec, status, {"a", "b"}, 2).has_value());
  ASSERT_TRUE(RecordPeerData(status, "b", Samples(640)).ok());
  std::optional<RoundCharge> charge = RoundChargeOf(spec, status, {"a", "b"}, 2);
  ASSERT_TRUE(charge.has_value());
  EXPECT_DOUBLE_EQ(charge->q, 32.0 / 640);  // b's shard is the smaller
  EXPECT_EQ(charge->steps, 5u);
  // A shard smaller than a batch: every sample in every step.
  ASSERT_TRUE(RecordPeerData(status, "c", Samples(20)).ok());
  EXPECT_DOUBLE_EQ(RoundChargeOf(spec, status, {"a", "c"}, 2)->q, 1.0);

  v1::PrivacyStatus privacy;
  InitPrivacyStatus(spec, privacy);
  for (int r = 1; r <= 3; ++r) {
    ASSERT_TRUE(ChargeRound(spec, *charge, privacy).ok());
    EXPECT_NEAR(privacy.epsilon(), EpsilonAfterSteps(32.0 / 640, 5 * r), 1e-9) << r;
    EXPECT_EQ(privacy.rounds(), static_cast<uint64_t>(r));
    EXPECT_EQ(privacy.steps(), static_cast<uint64_t>(5 * r));
  }
  EXPECT_DOUBLE_EQ(privacy.sampling_rate(), 32.0 / 640);
  // Level peer: one step at the round's peer sampling rate.
  EXPECT_DOUBLE_EQ(RoundChargeOf(DpSpec("p", 3), status, {"a"}, 4)->q, 0.25);
  EXPECT_EQ(RoundChargeOf(DpSpec("p", 3), status, {"a"}, 4)->steps, 1u);
}

class CoordinatorPrivacyTest : public CoordinatorCoreTest {
 protected:
  // Closes the open round `round` with peer a's update.
  void CloseRound(uint64_t round) {
    aggregator_.contributors = {"a"};
    Accept("t", round, "a");
    Step();
  }
};

TEST_F(CoordinatorPrivacyTest, EachRoundIsChargedAndShownAndTheRoundCarriesTheSettings) {
  auto sinks = StartTask(DpSpec("t", 3), {"a"});
  ASSERT_EQ(aggregator_.opened.size(), 1u);
  EXPECT_EQ(aggregator_.opened[0].dp().level(), common::v1::DP_LEVEL_PEER);
  EXPECT_DOUBLE_EQ(aggregator_.opened[0].dp().clip_norm(), 0.5);
  // RoundStarted names the round's n, for distributed noise.
  bool started = false;
  for (const auto& e : sinks["a"]->events) {
    if (e.has_round_started()) {
      started = true;
      EXPECT_EQ(e.round_started().expected_peers(), 1u);
    }
  }
  EXPECT_TRUE(started);
  v1::TaskStatus status = Status("t");
  ASSERT_TRUE(status.has_privacy());
  EXPECT_NEAR(status.privacy().epsilon(), EpsilonAfter(1), 1e-9);  // charged when it opened
  EXPECT_EQ(status.privacy().rounds(), 1u);
  EXPECT_EQ(metrics_->privacy_rounds.Value(), 1);

  CloseRound(1);
  CloseRound(2);
  status = Status("t");
  ASSERT_EQ(status.history_size(), 2);
  EXPECT_NEAR(status.history(0).epsilon(), EpsilonAfter(1), 1e-9);
  EXPECT_NEAR(status.history(1).epsilon(), EpsilonAfter(2), 1e-9);
  EXPECT_NEAR(status.privacy().epsilon(), EpsilonAfter(3), 1e-9);
  EXPECT_NEAR(metrics_->privacy_epsilon.Value(), EpsilonAfter(3), 1e-9);
}

TEST_F(CoordinatorPrivacyTest, ARestartKeepsTheBudgetAndARoundThatRunsAgainIsChargedAgain) {
  auto sinks = StartTask(DpSpec("t", 5), {"a"});
  CloseRound(1);  // version 1 checkpointed; round 2 opens (charged: 2 rounds)
  ASSERT_EQ(Status("t").round(), 2u);
  ASSERT_EQ(Status("t").privacy().rounds(), 2u);

  Recreate();  // a new coordinator process on the same state dir
  EXPECT_EQ(Status("t").privacy().rounds(), 2u);
  EXPECT_NEAR(Status("t").privacy().epsilon(), EpsilonAfter(2), 1e-9);
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:6666").ok());
  Step();  // restores checkpoint 1 into the aggregator: round 2 runs again
  EXPECT_EQ(Status("t").round(), 1u);
  auto a = Join("a");
  Step();
  EXPECT_EQ(aggregator_.opened.back().round(), 2u);
  // Round 2's first run may have released updates to the aggregator: it stays counted.
  EXPECT_EQ(Status("t").privacy().rounds(), 3u);
  EXPECT_NEAR(Status("t").privacy().epsilon(), EpsilonAfter(3), 1e-9);
}

TEST_F(CoordinatorPrivacyTest, TaskCompletesBeforeARoundThatWouldPassTheTarget) {
  const double target = (EpsilonAfter(2) + EpsilonAfter(3)) / 2;
  auto sinks = StartTask(DpSpec("t", 10, target), {"a"});
  CloseRound(1);
  CloseRound(2);
  // As after a last round: the published model is evaluated first.
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_EVALUATING);
  EXPECT_THAT(status.message(), HasSubstr("privacy budget reached"));
  ASSERT_TRUE(core_->OnMessage("a", Eval("t", status.model_version(), 80, 100)).ok());
  Step();
  status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_THAT(status.message(), HasSubstr("privacy budget reached"));
  EXPECT_THAT(status.message(), HasSubstr("target_epsilon"));
  EXPECT_EQ(aggregator_.opened.size(), 2u);  // round 3 never opened
  EXPECT_EQ(status.privacy().rounds(), 2u);
  EXPECT_LE(status.privacy().epsilon(), target);
  EXPECT_THAT(sinks["a"]->Take(), ::testing::Contains(v1::CoordinatorEvent::kTaskFinished));
}

TEST_F(CoordinatorPrivacyTest, SampleLevelWaitsForDataReportsAndLeavesTheAggregatorOut) {
  auto sinks = StartTask(SampleDpSpec("t", 3), {"a"});
  Step();
  EXPECT_TRUE(aggregator_.opened.empty());  // no data report yet: q is unknown
  v1::PeerMessage report;
  report.set_task("t");
  *report.mutable_data_report() = Samples(640);
  ASSERT_TRUE(core_->OnMessage("a", report).ok());
  Step();
  Step();
  ASSERT_EQ(aggregator_.opened.size(), 1u);
  // The peers' DP-SGD steps added the noise: the aggregator neither clips nor adds any.
  EXPECT_FALSE(aggregator_.opened[0].has_dp());
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.privacy().steps(), 5u);
  EXPECT_DOUBLE_EQ(status.privacy().sampling_rate(), 32.0 / 640);
  EXPECT_NEAR(status.privacy().epsilon(), EpsilonAfterSteps(32.0 / 640, 5), 1e-9);
}

TEST_F(CoordinatorPrivacyTest, CreateTaskRefusesBadSettingsNamingTheField) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  common::v1::TaskSpec spec = DpSpec("t", 3);
  spec.mutable_privacy()->mutable_dp()->set_clip_norm(0);
  auto created = core_->CreateTask(spec);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(created.status().message(), HasSubstr("privacy.dp.clip_norm"));
}

}  // namespace
}  // namespace shoal::coordinator::core_testing
