// Supernodes elected among the peers, on real processes (127.0.0.1, mutual TLS): a coordinator
// and six peers that offer to host one (shoal-peer --supernode), no dedicated aggregator. The
// coordinator elects a root, then one supernode per cluster of two; each elected peer runs
// shoal-aggregator as its child process, which registers naming it. A cluster's host is then
// SIGKILLed: its aggregator ends with it (PR_SET_PDEATHSIG), the task moves to a new tree, a
// peer that hosted nothing is elected in its place, and the task completes. The task
// aggregates with median, which runs within each cluster.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;

constexpr int kPeers = 6;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-elected-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

// Whether every cluster of the tree is served by an elected peer.
bool AllElected(const cv1::TaskStatus& s) {
  for (const cv1::ClusterInfo& c : s.clusters()) {
    if (c.host_peer().empty()) return false;
  }
  return s.clusters_size() > 0;
}

TEST(ElectedSupernodesClusterTest, PeersElectedByCapacityServeTheTreeAndAreReplacedWhenOneDies) {
  Cluster cluster(TempDir());
  cluster.set_batch_floor_ms(50);  // rounds of at least 1 s: a host dies mid-task
  {
    // A tree is rebuilt on a newly elected supernode 1 s after the one before (default 30 s).
    // No "better" elections: the matrix-multiply scores of processes that start together on
    // one loaded machine differ by 2x and more (coordinator_supernodes_test covers them).
    absl::Status started = cluster.StartCoordinator(
        {"--supernode-rebuild-interval=1s", "--supernode-better-factor=1000"});
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < kPeers; ++i) {
    absl::Status started = cluster.StartPeer(i, kPeers, {"--supernode"});
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(kPeers, absl::Seconds(60)).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("elected");
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  spec.set_min_participants(kPeers - 1);  // the task goes on after losing one
  spec.set_rounds(10);
  // Robust within each cluster (docs/explanation/aggregation.md, "Partial sums"): each cluster's
  // median, weighted by its samples, at the root.
  spec.set_aggregation(common::v1::AGGREGATION_MEDIAN);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // The tree: a root and three clusters of two, every one on an elected peer's aggregator.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.history_size() >= 1 && s.clusters_size() == 4 && AllElected(s);
      },
      Cluster::TaskBound(spec), "a round on a tree of four elected supernodes");
  ASSERT_TRUE(status.ok()) << status.status();
  std::set<std::string> hosts;
  for (const cv1::ClusterInfo& c : status->clusters()) {
    EXPECT_EQ(c.peers_size(), c.level() == 0 ? 0 : 2) << c.ShortDebugString();
    hosts.insert(c.host_peer());
  }
  EXPECT_EQ(hosts.size(), 4u) << "four different peers host the four aggregators";

  // The peers as operators see them: who hosts, and which aggregator is whose.
  auto nodes = cluster.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  std::map<std::string, std::string> address_of;  // peer id -> its PeerService address
  for (const cv1::NodeInfo& p : nodes->peers()) {
    address_of[p.id()] = p.address();
    EXPECT_EQ(p.supernode(), hosts.count(p.id()) > 0 ? "elected" : "offered") << p.id();
  }
  std::string doomed_aggregator;
  const std::string doomed = status->clusters(1).host_peer();  // a cluster's, not the root's
  for (const cv1::NodeInfo& a : nodes->aggregators()) {
    EXPECT_TRUE(hosts.count(a.supernode()) > 0) << a.ShortDebugString();
    if (a.supernode() == doomed) doomed_aggregator = a.address();
  }
  ASSERT_FALSE(doomed_aggregator.empty());
  int doomed_index = -1;
  for (int i = 0; i < kPeers; ++i) {
    if (cluster.peer(i).address == address_of[doomed]) doomed_index = i;
  }
  ASSERT_GE(doomed_index, 0) << "peer " << doomed << " at " << address_of[doomed];

  // SIGKILL the host: no Leave, no clean stop of its aggregator.
  cluster.peer(doomed_index).process->Signal(SIGKILL);
  // Its aggregator ends with it (the kernel sends it SIGTERM): nothing listens there soon.
  absl::StatusOr<HostPort> hp = ParseHostPort(doomed_aggregator, "aggregator");
  ASSERT_TRUE(hp.ok()) << hp.status();
  ASSERT_EQ(hp->host, "127.0.0.1");
  EXPECT_TRUE(WaitUntil([&] { return !AcceptsConnections(hp->port); }, absl::Seconds(20),
                        absl::Milliseconds(100)))
      << "the aggregator of killed peer " << doomed << " still listens on " << doomed_aggregator;

  // A new tree without it; a peer that hosted nothing is elected for the missing cluster.
  status = cluster.WaitFor(
      spec.name(),
      [&](const cv1::TaskStatus& s) {
        if (s.clusters_size() != 4 || !AllElected(s)) return false;
        for (const cv1::ClusterInfo& c : s.clusters()) {
          if (c.host_peer() == doomed) return false;
        }
        return true;
      },
      Cluster::TaskBound(spec), "a tree of four elected supernodes without the killed peer");
  ASSERT_TRUE(status.ok()) << status.status();
  std::set<std::string> new_hosts;
  for (const cv1::ClusterInfo& c : status->clusters()) new_hosts.insert(c.host_peer());
  std::set<std::string> newcomers;
  for (const std::string& h : new_hosts) {
    if (hosts.count(h) == 0) newcomers.insert(h);
  }
  EXPECT_EQ(newcomers.size(), 1u) << "one peer elected in place of " << doomed;

  status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << "\n"
                                                        << cluster.LogTails();
  EXPECT_EQ(status->model_version(), spec.rounds());
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_EQ(last.participants_size(), kPeers - 1) << last.ShortDebugString();
  EXPECT_GT(last.test_accuracy(), 0.5) << "far above chance (0.1): the elected tree trained";

  auto page = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(MetricValue(*page, "shoal_coordinator_supernode_elections_total{reason=\"needed\"}"),
            5);
  EXPECT_EQ(MetricValue(*page, "shoal_coordinator_supernode_ends_total{reason=\"lost\"}"), 1);
  EXPECT_EQ(MetricValue(*page, "shoal_coordinator_supernodes_elected"), 4);
  EXPECT_GE(MetricValue(*page, "shoal_coordinator_tree_rebuilds_total"), 1);
}

}  // namespace
}  // namespace shoal::testing
