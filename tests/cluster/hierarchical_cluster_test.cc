// A hierarchical task on real processes (127.0.0.1, mutual TLS): a coordinator, four
// aggregators and six peers, clusters of two, fanout 2: a root serving no peer, two clusters
// below it, and a third one level deeper, below the first. Each aggregator sums its cluster's
// updates exactly and sends its parent one partial sum per round (the first cluster's includes
// the one below it); the root publishes every version; every peer trains, and evaluates each
// version at its own cluster's aggregator. Updates travel compressed into the tree's leaves
// (int8 for the sync task, top-k with fp16 values for the async one), whose aggregators decode
// and validate them as a flat task's.

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

// A coordinator, `aggregators` aggregators and `peers` peers, all connected.
void Start(Cluster& cluster, int aggregators, int peers) {
  absl::Status started = cluster.StartCoordinator();
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  for (int i = 0; i < aggregators; ++i) {
    started = cluster.StartAggregator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < peers; ++i) {
    started = cluster.StartPeer(i, peers);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(peers, absl::Seconds(60)).ok()) << cluster.LogTails();
}

// Every peer pushed updates, each at least `fewer` times smaller than float32.
void ExpectCompressedPushes(Cluster& cluster, int peers, double fewer) {
  for (int i = 0; i < peers; ++i) {
    auto page = HttpGet(cluster.peer(i).metrics_address, "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    const double sent = MetricValue(*page, "shoal_peer_update_bytes_sent_total");
    const double raw = MetricValue(*page, "shoal_peer_update_bytes_raw_total");
    EXPECT_GT(sent, 0) << "peer-" << i;
    EXPECT_GT(raw, fewer * sent) << "peer-" << i << " sent " << sent << " of " << raw << " bytes";
  }
}

TEST(HierarchicalClusterTest, ClustersSendTheRootExactPartialSumsAndTheTaskCompletes) {
  Cluster cluster(TempDir());
  ASSERT_NO_FATAL_FAILURE(Start(cluster, 4, kPeers));
  common::v1::TaskSpec spec = SmallTask("tree");
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  spec.set_fanout(2);
  spec.set_min_participants(kPeers);
  spec.set_rounds(3);
  spec.mutable_aggregation_options()->set_exact_sum(true);
  spec.set_compression(common::v1::COMPRESSION_INT8);
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

  status = cluster.WaitForEnd(spec);
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
  ExpectCompressedPushes(cluster, kPeers, 3.9);
}

// Federated-async on a tree: three aggregators (a root serving no peer, two clusters of two
// below it), four peers training at their own pace. Each cluster's aggregator sends the root the
// aggregate of every full buffer as one update; only the root publishes versions, which come
// down the tree before the peers hear of them.
TEST(HierarchicalClusterTest, AsyncClustersSendTheRootTheirFullBuffersAndTheTaskCompletes) {
  constexpr int kAsyncPeers = 4;
  Cluster cluster(TempDir());
  ASSERT_NO_FATAL_FAILURE(Start(cluster, 3, kAsyncPeers));
  common::v1::TaskSpec spec = SmallTask("async-tree");
  spec.set_mode(common::v1::MODE_FEDERATED_ASYNC);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  spec.set_min_participants(kAsyncPeers);
  spec.mutable_async()->set_buffer_size(kAsyncPeers);  // the root: 4; each cluster: its 2
  spec.set_rounds(4);
  spec.set_compression(common::v1::COMPRESSION_TOPK);
  spec.set_topk_ratio(0.1);
  spec.set_topk_values(common::v1::COMPRESSION_FP16);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << "\n"
                                                        << cluster.LogTails();
  const std::string root = status->aggregator();
  EXPECT_EQ(status->model_version(), spec.rounds());
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  for (const cv1::RoundSummary& r : status->history()) {
    // A version holds both clusters' aggregates: at least one peer of each.
    EXPECT_GE(r.participants_size(), 2) << r.ShortDebugString();
  }
  for (const cv1::PeerProgress& p : status->peers()) {
    EXPECT_GT(p.updates(), 0u) << p.ShortDebugString();
  }
  EXPECT_EQ(status->peers_size(), kAsyncPeers);
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_TRUE(last.evaluation_complete()) << last.ShortDebugString();
  EXPECT_GT(last.test_accuracy(), 0.3) << "far above chance (0.1): the tree trained the model";

  // The root took no peer's update, only its children's aggregates: every one they sent (a
  // child counts one once the root has answered: read until both sides agree).
  double forwarded = 0, accepted_at_root = -1;
  EXPECT_TRUE(WaitUntil(
      [&] {
        forwarded = 0;
        for (int i = 0; i < cluster.aggregator_count(); ++i) {
          auto page = HttpGet(cluster.aggregator(i).metrics_address, "/metrics");
          if (!page.ok()) return false;
          if (cluster.aggregator(i).address == root) {
            accepted_at_root = MetricValue(*page, "shoal_aggregator_partials_accepted_total");
          } else {
            forwarded += MetricValue(*page, "shoal_aggregator_partials_forwarded_total");
          }
        }
        return accepted_at_root == forwarded;
      },
      absl::Seconds(10), absl::Milliseconds(100)))
      << "the root accepted " << accepted_at_root << " aggregates, its children sent " << forwarded;
  EXPECT_GE(accepted_at_root, 2.0 * spec.rounds()) << "two aggregates a version";
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    auto page = HttpGet(cluster.aggregator(i).metrics_address, "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    const bool is_root = cluster.aggregator(i).address == root;
    SCOPED_TRACE(absl::StrCat("aggregator ", i, is_root ? " (root)" : ""));
    EXPECT_EQ(MetricValue(*page, "shoal_aggregator_versions_published_total"),
              is_root ? spec.rounds() : 0.0);
    if (is_root) {
      EXPECT_EQ(MetricValue(*page, "shoal_aggregator_updates_accepted_total"), 0.0);
    } else {
      EXPECT_GE(MetricValue(*page, "shoal_aggregator_updates_accepted_total"), 4.0);
    }
  }
  // 10% of the first layer as fp16 values with their index gaps, the small tensors whole.
  ExpectCompressedPushes(cluster, kAsyncPeers, 5);
}

}  // namespace
}  // namespace shoal::testing
