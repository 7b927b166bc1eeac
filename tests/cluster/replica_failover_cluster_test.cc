// Replicas on real processes (127.0.0.1, mutual TLS, each aggregator its own certificate): a
// coordinator, seven aggregators and four peers; a hierarchical task with clusters of two and
// replicas 2: a root and two clusters, each with a primary and a backup, and one spare
// aggregator. The peers train at different speeds. In round 2, once the fastest peer's update
// is acknowledged by its cluster's primary (and so copied to the backup), that primary is
// SIGKILLed: the backup takes over the round, the slower peer of the cluster pushes there, the
// round completes within twice its deadline with every update counted exactly once (its sample
// count is four peers' worth), and the spare becomes the cluster's new backup. In round 3 the
// root is SIGKILLed while the peers train: its backup takes the round over (the clusters send
// their partial sums there), the round completes within twice its deadline with every update
// once, and the task completes on the new root.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;

constexpr int kPeers = 4;
constexpr int kAggregators = 7;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-replicas-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

double AggregatorMetric(Cluster& cluster, int index, const std::string& series) {
  auto page = HttpGet(cluster.aggregator(index).metrics_address, "/metrics");
  return page.ok() ? MetricValue(*page, series) : -1;
}

TEST(ReplicaFailoverClusterTest, ABackupTakesOverAKilledPrimaryMidRoundAndLosesNoUpdate) {
  Cluster cluster(TempDir());
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < kAggregators; ++i) {
    absl::Status started = cluster.StartAggregator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  // Peer i sleeps 100 x i ms after each of its 20 batches: rounds of about 0, 2, 4 and 6 s.
  for (int i = 0; i < kPeers; ++i) {
    absl::Status started =
        cluster.StartTestPeer(i, kPeers, {absl::StrCat("--test-slow-batch=", 100 * i)});
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(kPeers, absl::Seconds(60)).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("replicated");
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  spec.set_replicas(2);
  spec.set_min_participants(kPeers);
  spec.set_rounds(4);
  spec.set_round_deadline_seconds(30);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // Round 1 done, round 2 open, on a tree whose root and two clusters have a backup each.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        if (s.history_size() < 1 || s.clusters_size() != 3) return false;
        for (int i = 0; i < s.clusters_size(); ++i) {
          if (s.clusters(i).backups_size() != 1) return false;
        }
        return true;
      },
      Cluster::TaskBound(spec), "round 1 on a tree of three nodes with a backup each");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), 1) << "round 2 ended before the test could act";

  // The cluster of the fastest peer (process 0); its primary and backup.
  auto nodes = cluster.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  std::string fastest;
  for (const cv1::NodeInfo& p : nodes->peers()) {
    if (p.address() == cluster.peer(0).address) fastest = p.id();
  }
  ASSERT_FALSE(fastest.empty());
  std::string primary, backup;
  for (const cv1::ClusterInfo& c : status->clusters()) {
    for (const std::string& id : c.peers()) {
      if (id == fastest) {
        primary = c.aggregator();
        backup = c.backups(0);
      }
    }
  }
  ASSERT_FALSE(primary.empty()) << status->ShortDebugString();
  int doomed = -1, standby = -1;
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    if (cluster.aggregator(i).address == primary) doomed = i;
    if (cluster.aggregator(i).address == backup) standby = i;
  }
  ASSERT_GE(doomed, 0);
  ASSERT_GE(standby, 0);

  // Round 2: the fastest peer's update is acknowledged (the primary's third, after round 1's
  // two) and copied; the cluster's other peer is still training.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return AggregatorMetric(cluster, doomed, "shoal_aggregator_updates_accepted_total") >= 3 &&
               AggregatorMetric(cluster, doomed,
                                "shoal_aggregator_replications_total{result=\"copied\"}") >= 1;
      },
      absl::Seconds(60), absl::Milliseconds(20)))
      << cluster.LogTails();
  EXPECT_EQ(AggregatorMetric(cluster, doomed, "shoal_aggregator_updates_accepted_total"), 3)
      << "the cluster's slower peer pushed before the primary was killed";
  EXPECT_EQ(
      AggregatorMetric(cluster, doomed, "shoal_aggregator_replications_total{result=\"failed\"}"),
      0);
  cluster.aggregator(doomed).process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();

  status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.history_size() >= 2; },
      2 * absl::Seconds(spec.round_deadline_seconds()), "round 2 after the failover");
  ASSERT_TRUE(status.ok()) << status.status();
  const cv1::RoundSummary& round2 = status->history(1);
  EXPECT_LT(absl::FromUnixMillis(round2.completed_unix_ms()) - killed,
            2 * absl::Seconds(spec.round_deadline_seconds()));
  // Every update once: four peers, 20 batches of 32 samples each.
  EXPECT_EQ(round2.participants_size(), kPeers) << round2.ShortDebugString();
  EXPECT_EQ(round2.dropped_size(), 0) << round2.ShortDebugString();
  EXPECT_EQ(round2.num_samples(), static_cast<uint64_t>(kPeers) * 20 * 32)
      << round2.ShortDebugString();
  // The backup took the copy and, promoted, the cluster's other peer's own push.
  EXPECT_GE(AggregatorMetric(cluster, standby, "shoal_aggregator_updates_accepted_total"), 2);

  // The spare is the cluster's new backup; the task completes, every round with every peer.
  status = cluster.WaitFor(
      spec.name(),
      [&](const cv1::TaskStatus& s) {
        for (const cv1::ClusterInfo& c : s.clusters()) {
          if (c.aggregator() == backup) return c.backups_size() == 1 && c.backups(0) != primary;
        }
        return false;
      },
      absl::Seconds(30), "a new backup for the cluster taken over");
  ASSERT_TRUE(status.ok()) << status.status();

  // Round 3, the peers training: the root is lost.
  status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.round() == 3 && s.phase() == cv1::ROUND_PHASE_TRAINING;
      },
      Cluster::TaskBound(spec), "round 3 open");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), 2) << "round 3 ended before the test could act";
  ASSERT_EQ(status->clusters(0).backups_size(), 1) << status->ShortDebugString();
  const std::string root = status->clusters(0).aggregator();
  const std::string root_backup = status->clusters(0).backups(0);
  int root_index = -1;
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    if (cluster.aggregator(i).address == root) root_index = i;
  }
  ASSERT_GE(root_index, 0);
  cluster.aggregator(root_index).process->Signal(SIGKILL);
  const absl::Time root_killed = absl::Now();
  status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.history_size() >= 3; },
      2 * absl::Seconds(spec.round_deadline_seconds()), "round 3 after the root's failover");
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  const cv1::RoundSummary& round3 = status->history(2);
  EXPECT_LT(absl::FromUnixMillis(round3.completed_unix_ms()) - root_killed,
            2 * absl::Seconds(spec.round_deadline_seconds()));
  EXPECT_EQ(round3.participants_size(), kPeers) << round3.ShortDebugString();
  EXPECT_EQ(round3.num_samples(), static_cast<uint64_t>(kPeers) * 20 * 32)
      << round3.ShortDebugString();
  EXPECT_EQ(status->aggregator(), root_backup) << "the backup is the task's root";
  EXPECT_EQ(status->clusters(0).aggregator(), root_backup);

  status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << "\n"
                                                        << cluster.LogTails();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.participants_size(), kPeers) << r.ShortDebugString();
    EXPECT_EQ(r.num_samples(), static_cast<uint64_t>(kPeers) * 20 * 32) << r.ShortDebugString();
  }
  auto page = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(MetricValue(*page, "shoal_coordinator_failovers_total"), 2);
  // Three at the start (more if the tree was rebuilt meanwhile), one after the first failover.
  EXPECT_GE(MetricValue(*page, "shoal_coordinator_backups_assigned_total"), 4);
}

}  // namespace
}  // namespace shoal::testing
