// A hierarchical task on real processes (127.0.0.1, mutual TLS): a coordinator, three
// aggregators and six peers, clusters of three: a root and two children. Each child sums its
// cluster's updates exactly and sends the root one partial sum per round; the root publishes
// every version; every peer trains, and evaluates each version at its own cluster's aggregator.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"

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

// The value of a counter without labels in a Prometheus text page (-1 when absent).
double Counter(const std::string& page, const std::string& name) {
  const std::string prefix = name + " ";
  size_t at = 0;
  while ((at = page.find(prefix, at)) != std::string::npos) {
    if (at == 0 || page[at - 1] == '\n') {
      return std::stod(page.substr(at + prefix.size(), page.find('\n', at) - at));
    }
    at += prefix.size();
  }
  return -1;
}

TEST(HierarchicalClusterTest, ClustersSendTheRootExactPartialSumsAndTheTaskCompletes) {
  Cluster cluster(TempDir());
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < 3; ++i) {
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
  spec.set_cluster_size(3);
  spec.set_min_participants(kPeers);
  spec.set_rounds(3);
  spec.mutable_aggregation_options()->set_exact_sum(true);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // The tree: a root serving no peer, and two clusters of three, one aggregator each.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) { return s.round() >= 1 && s.clusters_size() == 3; },
      Cluster::TaskBound(spec), "the first round on a root and two clusters");
  ASSERT_TRUE(status.ok()) << status.status();
  std::set<std::string> aggregators;
  std::set<std::string> placed;
  for (const cv1::ClusterInfo& c : status->clusters()) {
    EXPECT_EQ(c.peers_size(), c.level() == 0 ? 0 : 3) << c.ShortDebugString();
    aggregators.insert(c.aggregator());
    placed.insert(c.peers().begin(), c.peers().end());
  }
  EXPECT_EQ(aggregators.size(), 3u);
  EXPECT_EQ(placed.size(), static_cast<size_t>(kPeers));
  EXPECT_EQ(status->clusters(0).aggregator(), status->aggregator());
  EXPECT_EQ(status->clusters(0).level(), 0u);
  EXPECT_EQ(status->clusters(1).level(), 1u);
  const std::string root = status->aggregator();

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

  // The root added two partial sums per round (one per child), took no peer's update and sent
  // no sum; each child took its three peers' updates and sent one sum per round.
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    auto page = HttpGet(cluster.aggregator(i).metrics_address, "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    const bool is_root = cluster.aggregator(i).address == root;
    SCOPED_TRACE(absl::StrCat("aggregator ", i, is_root ? " (root)" : " (child)"));
    EXPECT_EQ(Counter(*page, "shoal_aggregator_partials_accepted_total"),
              is_root ? 2.0 * spec.rounds() : 0.0);
    EXPECT_EQ(Counter(*page, "shoal_aggregator_partials_forwarded_total"),
              is_root ? 0.0 : 1.0 * spec.rounds());
    EXPECT_EQ(Counter(*page, "shoal_aggregator_updates_accepted_total"),
              is_root ? 0.0 : 3.0 * spec.rounds());
  }
}

}  // namespace
}  // namespace shoal::testing
