// Secure aggregation with real processes on 127.0.0.1 (mutual TLS): a coordinator, an aggregator
// and three peers. A federated-sync task with privacy.secure_aggregation completes: every round
// each peer sends its update masked through the aggregator's SecureAggregate (its identity key
// sent to the coordinator in its Hello, the others' received in RoundStarted), and the round
// publishes the mean of the three. A fourth peer too slow for the deadline is left out of a
// round, which publishes the other three's sum. On a supernode tree each cluster is one secure
// round whose sum alone goes up to the root.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::HasSubstr;

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SecureAggregationClusterTest, AFederatedSyncTaskWithSecureAggregationCompletes) {
  auto dir = MakeTestTempDir("shoal-secagg-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartPeer(i, 3).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("secure");
  spec.set_round_batches(10);
  spec.set_rounds(3);
  spec.set_min_participants(3);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(1.0);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status() << cluster.LogTails();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << cluster.LogTails();
  ASSERT_EQ(status->history_size(), 3);
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.participants_size(), 3) << r.ShortDebugString();
    EXPECT_EQ(r.model_version(), r.round()) << r.ShortDebugString();
  }
  for (int i = 0; i < 3; ++i) {
    const std::string log = ReadLog(cluster.dir() + "/peer-" + std::to_string(i) + ".log");
    EXPECT_THAT(log, HasSubstr("round 3: secure aggregation done, 3 updates in the sum")) << i;
  }
}

// A peer too slow for the round's deadline never advertises its keys: the coordinator closes the
// round at the deadline, the aggregator closes advertising then, and the other three peers' masks
// still cancel: the round publishes the mean of their three updates. The task has peer-level DP
// with distributed noise too: each peer clips its update and adds its share of the noise before
// masking, the aggregator adds the missing peer's share, and the round is charged.
TEST(SecureAggregationClusterTest, ARoundWithoutAPeerThatMissedItsDeadlinePublishesTheOthers) {
  auto dir = MakeTestTempDir("shoal-secagg-slow-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartPeer(i, 4).ok()) << cluster.LogTails();
  // 10 batches of 1.5 s each: far past the round's 6 s deadline.
  ASSERT_TRUE(cluster.StartTestPeer(3, 4, {"--test-slow-batch=1500"}).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(4, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("secure-slow");
  spec.set_round_batches(10);
  spec.set_rounds(1);
  spec.set_min_participants(4);
  spec.set_round_deadline_seconds(6);
  spec.mutable_privacy()->mutable_secure_aggregation();  // clip_norm: dp's
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(common::v1::DP_NOISE_DISTRIBUTED);
  dp.set_clip_norm(1.0);
  dp.set_noise_multiplier(1.0);
  dp.set_delta(1e-5);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status() << cluster.LogTails();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << cluster.LogTails();
  ASSERT_EQ(status->history_size(), 1);
  EXPECT_EQ(status->privacy().rounds(), 1u);
  EXPECT_GT(status->privacy().epsilon(), 0);
  const cv1::RoundSummary& round = status->history(0);
  EXPECT_EQ(round.participants_size(), 3) << round.ShortDebugString();
  EXPECT_EQ(round.dropped_size(), 1) << round.ShortDebugString();
  EXPECT_EQ(round.model_version(), 1u);
  for (int i = 0; i < 3; ++i) {
    const std::string log = ReadLog(cluster.dir() + "/peer-" + std::to_string(i) + ".log");
    EXPECT_THAT(log, HasSubstr("round 1: secure aggregation done, 3 updates in the sum")) << i;
    EXPECT_THAT(log, HasSubstr("share of noise multiplier 1 (distributed)")) << i;
  }
}

// On a tree: a root serving no peer and two clusters of three below it. Each cluster's
// aggregator runs its peers' secure round and sends the root only the cluster's sum; the root
// adds the two sums in a plain round and publishes the mean of all six updates.
TEST(SecureAggregationClusterTest, OnATreeEachClusterIsOneSecureRound) {
  auto dir = MakeTestTempDir("shoal-secagg-tree-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(cluster.StartPeer(i, 6).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(6, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("secure-tree");
  spec.set_round_batches(10);
  spec.set_rounds(2);
  spec.set_min_participants(6);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(3);
  spec.set_fanout(2);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(1.0);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status() << cluster.LogTails();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << cluster.LogTails();
  ASSERT_EQ(status->history_size(), 2);
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.participants_size(), 6) << r.ShortDebugString();
  }
  for (const cv1::ClusterInfo& c : status->clusters()) {
    EXPECT_EQ(c.peers_size(), c.level() == 0 ? 0 : 3) << c.ShortDebugString();
  }
  for (int i = 0; i < 6; ++i) {
    const std::string log = ReadLog(cluster.dir() + "/peer-" + std::to_string(i) + ".log");
    EXPECT_THAT(log, HasSubstr("round 2: secure aggregation done, 3 updates in the sum")) << i;
  }
  // The root added two clusters' sums a round and took no update; each cluster's aggregator
  // sent it one sum a round.
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    auto page = HttpGet(cluster.aggregator(i).metrics_address, "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    const bool is_root = cluster.aggregator(i).address == status->aggregator();
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_partials_accepted_total"), is_root ? 4 : 0) << i;
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_partials_forwarded_total"), is_root ? 0 : 2)
        << i;
  }
}

}  // namespace
}  // namespace shoal::testing
