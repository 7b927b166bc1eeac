// privacy.dp at level sample in a gossip task (services/coordinator/modes/gossip/gossip_privacy.h):
// the status shows the epsilon of the peer whose DP-SGD steps exposed its records the most, at
// batch_size over its own shard; a peer that left keeps counting.

#include "services/coordinator/modes/gossip/gossip_privacy.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/rdp_accountant.h"
#include "services/coordinator/peer_data.h"

namespace shoal::coordinator {
namespace {

constexpr double kSigma = 1.1;

double EpsilonOf(double q, int64_t steps) {
  auto accountant = privacy::RdpAccountant::Create();
  EXPECT_TRUE(accountant.ok());
  EXPECT_TRUE(accountant->AddSteps(q, kSigma, steps).ok());
  return accountant->Spent(1e-5)->epsilon;
}

common::v1::TaskSpec SampleDp() {
  common::v1::TaskSpec spec;
  spec.set_name("g");
  spec.set_mode(common::v1::MODE_GOSSIP);
  spec.set_batch_size(32);
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_SAMPLE);
  dp.set_clip_norm(1);
  dp.set_noise_multiplier(kSigma);
  dp.set_delta(1e-5);
  return spec;
}

class GossipPrivacyTest : public ::testing::Test {
 protected:
  void Report(const std::string& peer, uint64_t samples) {
    v1::DataReport report;
    report.set_train_samples(samples);
    ASSERT_TRUE(RecordPeerData(status_, peer, report).ok());
  }

  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{registry_};
  v1::TaskStatus status_;
};

TEST_F(GossipPrivacyTest, ShowsTheEpsilonOfTheLeastHiddenPeer) {
  GossipPrivacy privacy(SampleDp(), metrics_);
  ASSERT_TRUE(privacy.enabled());
  // No data report yet: nothing is counted, epsilon 0.
  privacy.Update({{"a", 100}, {"b", 100}}, 0, status_);
  EXPECT_EQ(status_.privacy().epsilon(), 0);
  EXPECT_EQ(status_.privacy().delta(), 1e-5);
  Report("a", 640);   // q = 0.05
  Report("b", 3200);  // q = 0.01
  // b trained more steps, but a's records are sampled five times as often.
  privacy.Update({{"a", 100}, {"b", 300}}, 1, status_);
  EXPECT_NEAR(status_.privacy().epsilon(), EpsilonOf(0.05, 100), 1e-9);
  EXPECT_GT(EpsilonOf(0.05, 100), EpsilonOf(0.01, 300));
  EXPECT_EQ(status_.privacy().steps(), 100u);
  EXPECT_DOUBLE_EQ(status_.privacy().sampling_rate(), 0.05);
  EXPECT_EQ(status_.privacy().rounds(), 1u);
  EXPECT_EQ(status_.privacy().rdp_orders_size(), status_.privacy().rdp_size());
  // a leaves: its records stay as exposed as its 100 steps made them; b goes on.
  privacy.Update({{"b", 2000}}, 2, status_);
  const double expected = std::max(EpsilonOf(0.05, 100), EpsilonOf(0.01, 2000));
  EXPECT_NEAR(status_.privacy().epsilon(), expected, 1e-9);
  // A count never goes down (a peer that reconnects reports from where it is).
  privacy.Update({{"b", 10}}, 2, status_);
  EXPECT_NEAR(status_.privacy().epsilon(), expected, 1e-9);
}

TEST_F(GossipPrivacyTest, DoesNothingWithoutSampleLevelDp) {
  common::v1::TaskSpec spec = SampleDp();
  spec.clear_privacy();
  GossipPrivacy privacy(spec, metrics_);
  EXPECT_FALSE(privacy.enabled());
  privacy.Update({{"a", 100}}, 1, status_);
  EXPECT_FALSE(status_.has_privacy());
}

}  // namespace
}  // namespace shoal::coordinator
