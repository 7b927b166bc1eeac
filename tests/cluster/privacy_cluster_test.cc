// Differential privacy with real processes on 127.0.0.1 (mutual TLS): a coordinator, an
// aggregator and two peers. A small peer-level DP task (MLP, distributed noise) completes, and
// its status shows after each round the epsilon an independent accountant gives for that many
// rounds; a second task (central noise) with a tight target_epsilon stops, completed, before
// the round that would pass it, with a message naming the budget; a third, at level sample,
// trains with DP-SGD on each peer and is charged round_batches steps per round at batch_size
// over the smallest shard; a fourth, decentralized with DP-SGD, stops at its budget too, and so
// does a fifth, decentralized at level peer (each participant noises what it serves); a sixth,
// gossip with DP-SGD, shows the epsilon its peers' steps spent. A peer-level DP task on a tree
// of three aggregators completes, published by the root alone.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "libs/privacy/rdp_accountant.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/http_get.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::HasSubstr;

constexpr double kSigma = 1.0;
constexpr double kDelta = 1e-5;

// epsilon after `rounds` rounds in which every peer takes part (q = 1).
double EpsilonAfter(int rounds) {
  auto accountant = privacy::RdpAccountant::Create();
  EXPECT_TRUE(accountant.ok());
  EXPECT_TRUE(accountant->AddSteps(1.0, kSigma, rounds).ok());
  return accountant->Spent(kDelta)->epsilon;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

common::v1::TaskSpec DpTask(const std::string& name, common::v1::DpNoise noise) {
  common::v1::TaskSpec spec = SmallTask(name);
  spec.set_round_batches(10);
  spec.set_rounds(3);
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_clip_norm(0.5);
  dp.set_noise_multiplier(kSigma);
  dp.set_noise(noise);
  dp.set_delta(kDelta);
  return spec;
}

TEST(PrivacyClusterTest, DpTasksShowEpsilonEachRoundATightBudgetStopsEarlyAndDpSgdTrains) {
  auto dir = MakeTestTempDir("shoal-privacy-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeers(0, 2, 2).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(2, absl::Seconds(60)).ok()) << cluster.LogTails();

  const common::v1::TaskSpec spec = DpTask("dp", common::v1::DP_NOISE_DISTRIBUTED);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  ASSERT_EQ(status->history_size(), 3);
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.participants_size(), 2) << r.ShortDebugString();
    const double want = EpsilonAfter(static_cast<int>(r.round()));
    EXPECT_NEAR(r.epsilon(), want, want * 1e-9) << r.round();
    std::printf("[ figure ] round %llu: epsilon %.4f at delta %g (independent accountant %.4f)\n",
                static_cast<unsigned long long>(r.round()), r.epsilon(), kDelta, want);
  }
  EXPECT_EQ(status->privacy().rounds(), 3u);
  EXPECT_NEAR(status->privacy().epsilon(), EpsilonAfter(3), 1e-6);
  EXPECT_DOUBLE_EQ(status->privacy().delta(), kDelta);
  EXPECT_THAT(ReadFile(cluster.dir() + "/peer-0.log"),
              HasSubstr("differential privacy: updates are clipped to L2 norm 0.5, with this "
                        "peer's share of noise multiplier 1 (distributed)"));

  // Room for two rounds, not three.
  common::v1::TaskSpec tight = DpTask("dp-tight", common::v1::DP_NOISE_CENTRAL);
  tight.set_rounds(10);
  const double target = (EpsilonAfter(2) + EpsilonAfter(3)) / 2;
  tight.mutable_privacy()->mutable_dp()->set_target_epsilon(target);
  ASSERT_TRUE(cluster.CreateTask(tight).ok());
  status = cluster.WaitForEnd(tight);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  EXPECT_THAT(status->message(), HasSubstr("privacy budget reached"));
  EXPECT_THAT(status->message(), HasSubstr("over target_epsilon"));
  ASSERT_EQ(status->history_size(), 2);
  EXPECT_TRUE(status->history(1).evaluated()) << "the last model is evaluated before the end";
  EXPECT_EQ(status->privacy().rounds(), 2u);
  EXPECT_LE(status->privacy().epsilon(), target);
  std::printf("[ figure ] dp-tight: %s\n", status->message().c_str());

  common::v1::TaskSpec sample = SmallTask("dp-sample");
  sample.set_round_batches(10);
  sample.set_rounds(2);
  sample.mutable_optimizer()->set_learning_rate(0.5);
  sample.mutable_optimizer()->set_momentum(0);
  common::v1::DpSpec& dp = *sample.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_SAMPLE);
  dp.set_clip_norm(1.0);
  dp.set_noise_multiplier(kSigma);
  dp.set_delta(kDelta);
  ASSERT_TRUE(cluster.CreateTask(sample).ok());
  status = cluster.WaitForEnd(sample);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  ASSERT_EQ(status->history_size(), 2);
  ASSERT_EQ(status->data_size(), 2);
  const uint64_t smallest =
      std::min(status->data(0).train_samples(), status->data(1).train_samples());
  const double q = 32.0 / static_cast<double>(smallest);
  auto accountant = privacy::RdpAccountant::Create();
  ASSERT_TRUE(accountant.ok());
  ASSERT_TRUE(accountant->AddSteps(q, kSigma, 2 * 10).ok());
  const double want = accountant->Spent(kDelta)->epsilon;
  EXPECT_EQ(status->privacy().steps(), 20u);
  EXPECT_DOUBLE_EQ(status->privacy().sampling_rate(), q);
  EXPECT_NEAR(status->privacy().epsilon(), want, want * 1e-9);
  EXPECT_GT(status->history(1).test_accuracy(), 0.3) << "DP-SGD still learns";
  EXPECT_THAT(ReadFile(cluster.dir() + "/peer-0.log"),
              HasSubstr("differential privacy: every step is DP-SGD: Poisson batches at q"));
  std::printf("[ figure ] dp-sample: epsilon %.4f after 20 steps at q %.4f, accuracy %.3f\n",
              status->privacy().epsilon(), q, status->history(1).test_accuracy());

  // Decentralized, the same DP-SGD: each round charged as it opens, before the peers train;
  // a target with room for one round of 10 steps, not two.
  common::v1::TaskSpec dec = sample;
  dec.set_name("dp-decentralized");
  dec.set_mode(common::v1::MODE_DECENTRALIZED);
  dec.set_rounds(5);
  dec.set_round_deadline_seconds(30);
  auto one = privacy::RdpAccountant::Create();
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(one->AddSteps(q, kSigma, 10).ok());
  const double after_one = one->Spent(kDelta)->epsilon;
  dec.mutable_privacy()->mutable_dp()->set_target_epsilon((after_one + want) / 2);
  ASSERT_TRUE(cluster.CreateTask(dec).ok());
  status = cluster.WaitForEnd(dec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  EXPECT_THAT(status->message(), HasSubstr("privacy budget reached"));
  ASSERT_EQ(status->history_size(), 1);
  EXPECT_EQ(status->history(0).participants_size(), 2);
  EXPECT_TRUE(status->history(0).evaluated()) << "the last model is evaluated before the end";
  EXPECT_EQ(status->privacy().steps(), 10u);
  EXPECT_NEAR(status->privacy().epsilon(), after_one, after_one * 1e-9);
  std::printf("[ figure ] dp-decentralized: %s\n", status->message().c_str());

  // Decentralized at level peer: each participant clips its update and adds the full noise
  // before serving it; each round is charged at q = 1, and the target has room for two rounds.
  const absl::Time dec_peer_start = absl::Now();
  common::v1::TaskSpec dec_peer = DpTask("dp-decentralized-peer", common::v1::DP_NOISE_CENTRAL);
  dec_peer.set_mode(common::v1::MODE_DECENTRALIZED);
  dec_peer.set_rounds(5);
  dec_peer.set_round_deadline_seconds(30);
  dec_peer.mutable_privacy()->mutable_dp()->set_target_epsilon(target);
  ASSERT_TRUE(cluster.CreateTask(dec_peer).ok());
  status = cluster.WaitForEnd(dec_peer);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  EXPECT_THAT(status->message(), HasSubstr("privacy budget reached"));
  ASSERT_EQ(status->history_size(), 2);
  EXPECT_EQ(status->history(1).participants_size(), 2);
  EXPECT_EQ(status->privacy().rounds(), 2u);
  EXPECT_DOUBLE_EQ(status->privacy().sampling_rate(), 1.0);
  EXPECT_NEAR(status->privacy().epsilon(), EpsilonAfter(2), EpsilonAfter(2) * 1e-9);
  EXPECT_THAT(ReadFile(cluster.dir() + "/peer-0.log"),
              HasSubstr("round updates are clipped to L2 norm 0.5 and carry noise of stddev 0.5 "
                        "before they are served"));
  std::printf("[ figure ] dp-decentralized-peer (%.1f s): %s\n",
              absl::ToDoubleSeconds(absl::Now() - dec_peer_start), status->message().c_str());

  // Gossip with DP-SGD: each peer trains its 20 steps; the status shows the epsilon of those
  // steps at batch_size over the smaller shard (no target: nothing stops a gossip peer).
  const absl::Time gossip_start = absl::Now();
  common::v1::TaskSpec gossip = sample;
  gossip.set_name("dp-gossip");
  gossip.set_mode(common::v1::MODE_GOSSIP);
  ASSERT_TRUE(cluster.CreateTask(gossip).ok());
  status = cluster.WaitForEnd(gossip);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  EXPECT_EQ(status->privacy().steps(), 20u);
  EXPECT_DOUBLE_EQ(status->privacy().sampling_rate(), q);
  EXPECT_NEAR(status->privacy().epsilon(), want, want * 1e-9);
  std::printf("[ figure ] dp-gossip (%.1f s): epsilon %.4f after 20 steps at q %.4f\n",
              absl::ToDoubleSeconds(absl::Now() - gossip_start), status->privacy().epsilon(), q);
}

// Peer-level DP on a tree: three aggregators (a root serving no peer, two clusters of two) and
// four peers with distributed noise. The clusters send sums of clipped updates; only the root
// publishes, and every round is charged as in a flat task.
TEST(PrivacyClusterTest, APeerLevelDpTaskRunsOnATree) {
  auto dir = MakeTestTempDir("shoal-privacy-tree-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeers(0, 4, 4).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(4, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = DpTask("dp-tree", common::v1::DP_NOISE_DISTRIBUTED);
  spec.set_rounds(2);
  spec.set_min_participants(4);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << "\n"
                                                        << cluster.LogTails();
  ASSERT_EQ(status->history_size(), 2);
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.participants_size(), 4) << r.ShortDebugString();
    const double want = EpsilonAfter(static_cast<int>(r.round()));
    EXPECT_NEAR(r.epsilon(), want, want * 1e-9) << r.round();
  }
  EXPECT_EQ(status->model_version(), 2u);
  // Each cluster sent the root one partial sum a round; the root took no peer's update.
  const std::string root = status->aggregator();
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    auto page = HttpGet(cluster.aggregator(i).metrics_address, "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    const bool is_root = cluster.aggregator(i).address == root;
    SCOPED_TRACE(is_root ? "the root" : "a cluster");
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_updates_accepted_total"), is_root ? 0.0 : 4.0);
    EXPECT_EQ(MetricValue(*page, is_root ? "shoal_aggregator_partials_accepted_total"
                                         : "shoal_aggregator_partials_forwarded_total"),
              is_root ? 4.0 : 2.0);
  }
  EXPECT_THAT(ReadFile(cluster.dir() + "/peer-0.log"),
              HasSubstr("with this peer's share of noise multiplier 1 (distributed)"));
}

}  // namespace
}  // namespace shoal::testing
