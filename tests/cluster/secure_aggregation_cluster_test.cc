// Secure aggregation with real processes on 127.0.0.1 (mutual TLS): a coordinator, an aggregator
// and three peers. A federated-sync task with privacy.secure_aggregation completes: every round
// each peer sends its update masked through the aggregator's SecureAggregate (its identity key
// sent to the coordinator in its Hello, the others' received in RoundStarted), and the round
// publishes the mean of the three. A fourth peer too slow for the deadline is left out of a
// round, which publishes the other three's sum. On a supernode tree each cluster is one secure
// round whose sum alone goes up to the root; with replicas, a backup that takes over a cluster
// whose primary is SIGKILLed in the middle of its secure round starts the round again, and the
// peers mask again there with fresh keys.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::HasSubstr;
using ::testing::Not;

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
  ASSERT_TRUE(cluster.StartPeers(0, 3, 3).ok()) << cluster.LogTails();
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
  ASSERT_TRUE(cluster.StartPeers(0, 3, 4).ok()) << cluster.LogTails();
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
  ASSERT_TRUE(cluster.StartPeers(0, 6, 6).ok()) << cluster.LogTails();
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

// Replicas: a root, a cluster of three peers and its backup. Two peers are fast and one slow:
// in round 2 the fast ones trained and went into the cluster's secure round at its primary, where
// advertising waits for the slow one; then the primary is SIGKILLed. The coordinator promotes
// the backup, which starts the secure round again from its first step (the standby it held took
// nothing of the primary's run); the peers try it with fresh keys, all three mask there, and
// round 2 publishes the mean of all three without running again.
TEST(SecureAggregationClusterTest, OnATreeABackupStartsAKilledPrimarysSecureRoundAgain) {
  auto dir = MakeTestTempDir("shoal-secagg-replica-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeers(0, 2, 3).ok()) << cluster.LogTails();
  // 10 batches of 0.4 s each: a round of 4 s, well within its deadline.
  ASSERT_TRUE(cluster.StartTestPeer(2, 3, {"--test-slow-batch=400"}).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("secure-replicated");
  spec.set_round_batches(10);
  spec.set_rounds(2);
  spec.set_min_participants(3);
  spec.set_round_deadline_seconds(15);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(3);
  spec.set_replicas(2);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(1.0);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // Round 1 done on a root and one cluster with a backup.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.history_size() >= 1 && s.clusters_size() == 2 && s.clusters(1).backups_size() == 1;
      },
      Cluster::TaskBound(spec), "round 1 on a cluster with a backup");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), 1) << "round 2 ended before the test could act";
  const std::string primary = status->clusters(1).aggregator();
  const std::string backup = status->clusters(1).backups(0);
  int doomed = -1, standby = -1;
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    if (cluster.aggregator(i).address == primary) doomed = i;
    if (cluster.aggregator(i).address == backup) standby = i;
  }
  ASSERT_GE(doomed, 0) << status->ShortDebugString();
  ASSERT_GE(standby, 0) << status->ShortDebugString();

  // Round 2: both fast peers trained (two rounds of 10 batches of 32) and are in the secure
  // round, which waits for the slow one.
  auto trained = [&](int peer) {
    auto page = HttpGet(cluster.peer(peer).metrics_address, "/metrics");
    return page.ok() ? MetricValue(*page, "shoal_peer_samples_trained_total") : -1;
  };
  ASSERT_TRUE(WaitUntil([&] { return trained(0) >= 640 && trained(1) >= 640; }, absl::Seconds(30),
                        absl::Milliseconds(20)))
      << cluster.LogTails();
  ASSERT_LT(trained(2), 640) << "the slow peer was done before the test could act";
  cluster.aggregator(doomed).process->Signal(SIGKILL);
  status = cluster.WaitFor(
      spec.name(),
      [&](const cv1::TaskStatus& s) {
        return s.clusters_size() == 2 && s.clusters(1).aggregator() == backup;
      },
      absl::Seconds(30), "the backup in the primary's place");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->history_size(), 1) << "round 2 is still running";

  status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << cluster.LogTails();
  ASSERT_EQ(status->history_size(), 2);
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.participants_size(), 3) << r.ShortDebugString();
    EXPECT_EQ(r.model_version(), r.round()) << r.ShortDebugString();
  }
  auto page = HttpGet(cluster.aggregator(standby).metrics_address, "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(MetricValue(*page, "shoal_aggregator_secure_restarts_total"), 1);
  EXPECT_EQ(MetricValue(*page, "shoal_aggregator_partials_forwarded_total"), 1);
  const std::string log_name = standby == 0 ? "aggregator" : absl::StrCat("aggregator-", standby);
  EXPECT_THAT(ReadLog(absl::StrCat(cluster.dir(), "/", log_name, ".log")),
              HasSubstr("round 2 of task 'secure-replicated': this backup takes over the secure "
                        "round of its lost primary"));
  page = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(MetricValue(*page, "shoal_coordinator_failovers_total"), 1);
  const std::string coordinator = ReadLog(cluster.dir() + "/coordinator.log");
  EXPECT_THAT(coordinator, Not(HasSubstr("runs again"))) << "the round completed on the backup";
  for (int i = 0; i < 2; ++i) {
    const std::string log = ReadLog(cluster.dir() + "/peer-" + std::to_string(i) + ".log");
    EXPECT_THAT(log, HasSubstr(absl::StrCat("round 2: secure aggregation: trying ", backup,
                                            " with fresh keys")))
        << i;
    EXPECT_THAT(log, HasSubstr("round 2: secure aggregation done, 3 updates in the sum")) << i;
  }
}

}  // namespace
}  // namespace shoal::testing
