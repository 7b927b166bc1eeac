// A hierarchical task on real processes (127.0.0.1, mutual TLS): a coordinator, four
// aggregators and six peers, clusters of two, fanout 2: a root serving no peer, two clusters
// below it, and a third one level deeper, below the first. Each aggregator sums its cluster's
// updates exactly and sends its parent one partial sum per round (the first cluster's includes
// the one below it); the root publishes every version; every peer trains, and evaluates each
// version at its own cluster's aggregator.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::HasSubstr;

constexpr int kPeers = 6;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-hierarchical-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

TEST(HierarchicalClusterTest, ClustersSendTheRootExactPartialSumsAndTheTaskCompletes) {
  Cluster cluster(TempDir());
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < 4; ++i) {
    absl::Status started = cluster.StartAggregator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < kPeers; ++i) {
    absl::Status started = cluster.StartPeer(i, kPeers);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(kPeers, absl::Seconds(60)).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("tree");
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  spec.set_fanout(2);
  spec.set_min_participants(kPeers);
  spec.set_rounds(3);
  spec.mutable_aggregation_options()->set_exact_sum(true);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // The tree: a root serving no peer; two clusters of two below it, and one below the first.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) { return s.round() >= 1 && s.clusters_size() == 4; },
      Cluster::TaskBound(spec), "the first round on a tree of four aggregators");
  ASSERT_TRUE(status.ok()) << status.status();
  std::set<std::string> aggregators;
  std::set<std::string> placed;
  for (const cv1::ClusterInfo& c : status->clusters()) {
    EXPECT_EQ(c.peers_size(), c.level() == 0 ? 0 : 2) << c.ShortDebugString();
    aggregators.insert(c.aggregator());
    placed.insert(c.peers().begin(), c.peers().end());
  }
  EXPECT_EQ(aggregators.size(), 4u);
  EXPECT_EQ(placed.size(), static_cast<size_t>(kPeers));
  const std::string root = status->aggregator();
  ASSERT_EQ(status->clusters(0).aggregator(), root);
  EXPECT_EQ(status->clusters(0).level(), 0u);
  EXPECT_EQ(status->clusters(1).parent(), root);
  EXPECT_EQ(status->clusters(2).parent(), root);
  EXPECT_EQ(status->clusters(3).level(), 2u);
  const std::string middle = status->clusters(1).aggregator();
  EXPECT_EQ(status->clusters(3).parent(), middle);
  // The coordinator's gauges show the tree (set every 100 ms).
  double depth = -1, clusters = -1;
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto page = HttpGet(cluster.coordinator().metrics_address, "/metrics");
        if (!page.ok()) return false;
        depth = MetricValue(*page, "shoal_coordinator_tree_depth");
        clusters = MetricValue(*page, "shoal_coordinator_tree_clusters");
        return depth == 2 && clusters == 3;
      },
      absl::Seconds(10), absl::Milliseconds(100)))
      << "tree depth " << depth << ", clusters " << clusters;

  status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.state() != cv1::TASK_STATE_RUNNING && s.state() != cv1::TASK_STATE_WAITING;
      },
      Cluster::TaskBound(spec), "the end of the task");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << "\n"
                                                        << cluster.LogTails();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  for (const cv1::RoundSummary& r : status->history()) {
    // Every peer's update is in every round, whichever aggregator it pushed to.
    EXPECT_EQ(r.participants_size(), kPeers) << r.ShortDebugString();
    EXPECT_EQ(r.dropped_size(), 0) << r.ShortDebugString();
  }
  EXPECT_EQ(status->model_version(), spec.rounds());
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_TRUE(last.evaluation_complete()) << last.ShortDebugString();
  EXPECT_GT(last.test_accuracy(), 0.5) << "far above chance (0.1): the tree trained the model";

  // Per round: the root added two partial sums (its children's) and took no update; the first
  // cluster's aggregator added the sum of the cluster below it; every aggregator but the root
  // took its two peers' updates and sent its parent one sum.
  const double rounds = spec.rounds();
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    auto page = HttpGet(cluster.aggregator(i).metrics_address, "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    const std::string& address = cluster.aggregator(i).address;
    const bool is_root = address == root;
    SCOPED_TRACE(absl::StrCat("aggregator ", i, " at ", address,
                              is_root             ? " (root)"
                              : address == middle ? " (middle)"
                                                  : ""));
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_partials_accepted_total"), is_root ? 2 * rounds
                                                                              : address == middle
                                                                                  ? rounds
                                                                                  : 0.0);
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_partials_forwarded_total"),
              is_root ? 0.0 : rounds);
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_updates_accepted_total"),
              is_root ? 0.0 : 2 * rounds);
  }
}

}  // namespace
}  // namespace shoal::testing
