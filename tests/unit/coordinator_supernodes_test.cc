// Supernodes elected among the peers (CoordinatorCore, coordinator_core_supernodes.cc): the
// peers that offer (Hello.supernode) are elected when the tasks want more aggregators than are
// free, the well connected first, then by capacity; an elected peer's aggregator registers naming
// it and serves like a dedicated one; the tree is rebuilt once on the newcomers; an elected
// aggregator outlives its host's broken session, and when it is lost another peer is elected; an
// election that never registers is passed over; a clearly better node (more compute, or a faster
// uplink) replaces the worst it beats; unused supernodes are retired.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
using core_testing::FakeSink;
using core_testing::Hello;
using core_testing::Spec;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// A peer's capacity: `gflops` of compute on one core.
common::v1::Capacity Compute(double gflops) {
  common::v1::Capacity c;
  c.set_cpu_cores(1);
  c.set_matmul_gflops(gflops);
  return c;
}

constexpr double kMbit = 1e6 / 8;  // bytes per second

std::string AddressOf(const std::string& peer) {
  return absl::StrCat("127.0.0.1:", 8000 + static_cast<int>(peer[0]));
}

class CoordinatorSupernodesTest : public CoordinatorCoreTest {
 protected:
  // Joins a peer that offers to host a supernode (unless `offers` is false), with its measured
  // upload in bytes per second (0: not measured).
  std::shared_ptr<FakeSink> JoinWith(const std::string& name, double gflops, bool offers = true,
                                     double upload = 0) {
    v1::Hello hello = Hello(name);
    *hello.mutable_capacity() = Compute(gflops);
    hello.mutable_capacity()->set_upload_bytes_per_second(upload);
    hello.set_supernode(offers);
    auto sink = std::make_shared<FakeSink>();
    auto id = core_->Connect(hello, "", sink);
    EXPECT_TRUE(id.ok()) << id.status();
    sinks_[name] = sink;
    gflops_[name] = gflops;
    uploads_[name] = upload;
    return sink;
  }
  // The peers told BecomeSupernode since the last call (their events are forgotten).
  std::set<std::string> Elected() {
    std::set<std::string> elected;
    for (auto& [name, sink] : sinks_) {
      for (const v1::CoordinatorEvent& e : sink->events) {
        if (e.has_become_supernode()) elected.insert(name);
      }
      sink->events.clear();
    }
    return elected;
  }
  // The elected peer's capacity as its aggregator reports it (the same compute and upload).
  common::v1::Capacity AggregatorCapacity(const std::string& peer) {
    common::v1::Capacity c = Compute(gflops_[peer]);
    c.set_upload_bytes_per_second(uploads_[peer]);
    return c;
  }
  // The elected peer's aggregator registers.
  absl::Status Register(const std::string& peer) {
    absl::Status s = core_->RegisterAggregator(AddressOf(peer), AggregatorCapacity(peer), "", peer);
    if (s.ok()) registered_.insert(peer);
    return s;
  }
  // Lets `d` pass a second at a time: every peer sends its heartbeats, every aggregator
  // registers again (until refused: retired), the driver steps.
  void Pass(absl::Duration d) {
    v1::PeerMessage heartbeat;
    heartbeat.mutable_heartbeat();
    for (absl::Duration passed; passed < d; passed += absl::Seconds(1)) {
      clock_.Advance(std::min(absl::Seconds(1), d - passed));
      for (const auto& [name, sink] : sinks_) EXPECT_TRUE(core_->OnMessage(name, heartbeat).ok());
      for (auto it = registered_.begin(); it != registered_.end();) {
        it = core_->RegisterAggregator(AddressOf(*it), AggregatorCapacity(*it), "", *it).ok()
                 ? std::next(it)
                 : registered_.erase(it);
      }
      Step();
    }
  }
  double Metric(const std::string& name, const std::string& label = "") {
    for (const auto& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        if (!label.empty() && (m.label.empty() || m.label[0].value != label)) continue;
        return family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      }
    }
    return -1;
  }
  // Creates task "t": hierarchical, 5 rounds, clusters of `cluster_size` for `n` peers.
  absl::Status CreateHierarchical(int n, int cluster_size) {
    common::v1::TaskSpec spec = Spec("t", n, 5);
    spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
    spec.set_cluster_size(cluster_size);
    return core_->CreateTask(spec).status();
  }
  // A hierarchical task with clusters of `cluster_size` for `n` peers (a, b, c, ...: compute 1,
  // 2, 3, ...), every one offering; its tree of 1 + ceil(n / cluster_size) elected supernodes
  // built.
  void BuildTree(int n, int cluster_size = 2) {
    ASSERT_TRUE(CreateHierarchical(n, cluster_size).ok());
    for (int i = 0; i < n; ++i) JoinWith(std::string(1, static_cast<char>('a' + i)), 1.0 + i);
    Step();
    const std::set<std::string> root = Elected();
    ASSERT_EQ(root.size(), 1u) << "a root, for the task waiting for an aggregator";
    ASSERT_TRUE(Register(*root.begin()).ok());
    Step();  // the peers join the task at its root; more supernodes are wanted
    const std::set<std::string> more = Elected();
    ASSERT_EQ(more.size(), static_cast<size_t>((n + cluster_size - 1) / cluster_size));
    for (const std::string& p : more) ASSERT_TRUE(Register(p).ok());
    Step();  // the tree is rebuilt on them
    hosts_ = root;
    hosts_.insert(more.begin(), more.end());
  }

  std::map<std::string, std::shared_ptr<FakeSink>> sinks_;
  std::map<std::string, double> gflops_;
  std::map<std::string, double> uploads_;
  std::set<std::string> hosts_;
  std::set<std::string> registered_;  // elected peers whose aggregator registered
};

TEST_F(CoordinatorSupernodesTest, TheBestCandidatesAreElectedAndTheTreeIsBuiltOnThem) {
  ASSERT_TRUE(CreateHierarchical(5, 2).ok());
  JoinWith("a", 1);
  JoinWith("b", 9, /*offers=*/false);
  JoinWith("c", 5);
  JoinWith("d", 3);
  JoinWith("e", 4);
  JoinWith("f", 2);
  Step();
  // The task waits for an aggregator: one is wanted, the strongest that offers is elected.
  EXPECT_THAT(Elected(), UnorderedElementsAre("c"));
  Step();
  EXPECT_TRUE(Elected().empty()) << "an election is pending: nobody else";
  ASSERT_TRUE(Register("c").ok());
  EXPECT_EQ(Status("t").aggregator(), AddressOf("c"));
  Step();
  // The six peers joined it; clusters of 2 want 1 + 3 aggregators.
  ASSERT_EQ(Status("t").participants_size(), 6);
  const std::set<std::string> more = Elected();
  EXPECT_EQ(more, (std::set<std::string>{"e", "d", "f"})) << "the next best, by compute";
  for (const std::string& p : more) ASSERT_TRUE(Register(p).ok());
  EXPECT_EQ(Metric("shoal_coordinator_tree_rebuilds_total"), 0);
  Step();
  EXPECT_EQ(Metric("shoal_coordinator_tree_rebuilds_total"), 1);
  EXPECT_EQ(Metric("shoal_coordinator_supernode_elections_total", "needed"), 4);
  EXPECT_EQ(Metric("shoal_coordinator_supernodes_elected"), 4);

  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 4);
  EXPECT_EQ(status.clusters(0).host_peer(), "c");
  EXPECT_TRUE(status.clusters(0).peers().empty()) << "the root serves no peer once it has children";
  std::set<std::string> hosts;
  for (const v1::ClusterInfo& cluster : status.clusters()) {
    hosts.insert(cluster.host_peer());
    EXPECT_LE(cluster.peers_size(), 2) << cluster.ShortDebugString();
  }
  EXPECT_EQ(hosts, (std::set<std::string>{"c", "d", "e", "f"}));

  // Operators see who offers and who was elected, and whose aggregator each is.
  const v1::ListNodesResponse nodes = core_->ListNodes();
  for (const v1::NodeInfo& peer : nodes.peers()) {
    EXPECT_EQ(peer.supernode(), peer.id() == "b"   ? ""
                                : peer.id() == "a" ? "offered"
                                                   : "elected")
        << peer.id();
  }
  std::set<std::string> aggregator_hosts;
  for (const v1::NodeInfo& a : nodes.aggregators()) aggregator_hosts.insert(a.supernode());
  EXPECT_EQ(aggregator_hosts, hosts);
}

// A supernode sends each version to its cluster and takes its updates: a peer behind a slow
// uplink is elected only after those with at least half the best candidate's upload, however
// much compute it has.
TEST_F(CoordinatorSupernodesTest, TheWellConnectedAreElectedBeforeMoreComputeBehindASlowLink) {
  ASSERT_TRUE(CreateHierarchical(4, 2).ok());
  JoinWith("a", 10, true, 5 * kMbit);    // the most compute, a home uplink
  JoinWith("b", 4, true, 1000 * kMbit);  // the best upload
  JoinWith("c", 3, true, 600 * kMbit);   // well connected: over half of b's
  JoinWith("d", 9, true, 400 * kMbit);   // under half of b's
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("b")) << "the well connected with the most compute";
  ASSERT_TRUE(Register("b").ok());
  Step();
  // Clusters of 2 for 4 peers: 1 + 2 aggregators wanted, b serves the root; of the others, c
  // (well connected, now the best upload's half is 300 Mbit/s: d is too) and d outrank a.
  EXPECT_EQ(Elected(), (std::set<std::string>{"c", "d"}));
}

TEST_F(CoordinatorSupernodesTest, OnlyAnElectedConnectedPeerMayHostAnAggregator) {
  absl::Status s = core_->RegisterAggregator("127.0.0.1:9001", {}, "", "ghost");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("ghost"));
  JoinWith("a", 1);
  s = core_->RegisterAggregator("127.0.0.1:9001", {}, "", "a");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "a was not elected: " << s;
  EXPECT_TRUE(core_->ListNodes().aggregators().empty());
  // A dedicated aggregator names no host.
  EXPECT_TRUE(core_->RegisterAggregator("127.0.0.1:9002").ok());
}

TEST_F(CoordinatorSupernodesTest, AHostsAggregatorOutlivesItsSessionAndIsReplacedWhenLost) {
  BuildTree(6);  // a..f: f, e, d, c elected (compute 6..3); a and b offer but are not needed
  ASSERT_EQ(hosts_, (std::set<std::string>{"c", "d", "e", "f"}));
  ASSERT_EQ(Status("t").aggregator(), AddressOf("f"));
  // c's session breaks: its aggregator (a process of its own) serves on, registering as before;
  // c reconnects and is still its host.
  const std::string host = "c";
  core_->Disconnect(host, sinks_[host].get());
  sinks_.erase(host);
  Pass(absl::Seconds(3));
  EXPECT_TRUE(Elected().empty());
  bool serving = false;
  const v1::TaskStatus during = Status("t");
  for (const v1::ClusterInfo& cluster : during.clusters()) {
    serving = serving || cluster.host_peer() == host;
  }
  EXPECT_TRUE(serving) << "a broken session does not end the supernode";
  JoinWith(host, gflops_[host]);
  Pass(absl::Seconds(1));
  EXPECT_TRUE(Elected().empty()) << "c hosts already";

  // c dies with its aggregator: the aggregator is lost (its watch breaks), the task moves to a
  // new tree at once (its root and the other clusters), and the best candidate left is elected
  // for the missing one.
  core_->Disconnect(host, sinks_[host].get());
  sinks_.erase(host);
  registered_.erase(host);
  aggregator_.BreakWatches(AddressOf(host), absl::UnavailableError("connection reset"));
  Step();
  EXPECT_EQ(Metric("shoal_coordinator_supernode_ends_total", "lost"), 1);
  const v1::ListNodesResponse nodes = core_->ListNodes();
  for (const v1::NodeInfo& a : nodes.aggregators()) EXPECT_NE(a.address(), AddressOf(host));
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("b"));
  ASSERT_TRUE(Register("b").ok());
  Step();
  const v1::TaskStatus status = Status("t");
  EXPECT_FALSE(status.aggregator().empty());
  for (const v1::ClusterInfo& cluster : status.clusters()) EXPECT_NE(cluster.host_peer(), host);
}

TEST_F(CoordinatorSupernodesTest, APendingElectionEndsWithItsPeer) {
  common::v1::TaskSpec spec = Spec("t", 2, 5);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  JoinWith("a", 1);
  JoinWith("b", 2);
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("b"));
  core_->Disconnect("b", sinks_["b"].get());
  sinks_.erase("b");
  EXPECT_EQ(Metric("shoal_coordinator_supernode_ends_total", "host_left"), 1);
  EXPECT_EQ(Register("b").code(), absl::StatusCode::kFailedPrecondition);
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("a"));
}

TEST_F(CoordinatorSupernodesTest, AnElectionThatNeverRegistersIsPassedOver) {
  common::v1::TaskSpec spec = Spec("t", 2, 5);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  JoinWith("a", 1);
  JoinWith("b", 2);
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("b"));
  Pass(options_.supernodes.election_timeout + absl::Seconds(1));
  EXPECT_THAT(Elected(), UnorderedElementsAre("a"));
  EXPECT_EQ(Metric("shoal_coordinator_supernode_ends_total", "timeout"), 1);
  // b's aggregator, too late, is refused; b is not elected again.
  EXPECT_EQ(Register("b").code(), absl::StatusCode::kFailedPrecondition);
  Pass(options_.supernodes.election_timeout + absl::Seconds(1));
  EXPECT_TRUE(Elected().empty()) << "a is pending (and then passed over), b failed before";
}

TEST_F(CoordinatorSupernodesTest, AClearlyBetterNodeReplacesTheWeakestAfterTheInterval) {
  // a..d: d the root; clusters of 3 on c (a, b, c) and b (d); a not needed.
  BuildTree(4, /*cluster_size=*/3);
  ASSERT_EQ(hosts_, (std::set<std::string>{"b", "c", "d"}));
  // g joins b's cluster (no aggregator more is wanted), with more than twice the compute of
  // the weakest cluster aggregator (b).
  JoinWith("g", 7);
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("g"));
  EXPECT_EQ(Metric("shoal_coordinator_supernode_elections_total", "better"), 1);
  ASSERT_TRUE(Register("g").ok());
  Step();
  EXPECT_EQ(Metric("shoal_coordinator_tree_rebuilds_total"), 1) << "not within the interval";
  Pass(options_.supernodes.rebuild_interval);
  EXPECT_EQ(Metric("shoal_coordinator_tree_rebuilds_total"), 2);
  std::set<std::string> hosts;
  const v1::TaskStatus status = Status("t");
  for (const v1::ClusterInfo& cluster : status.clusters()) hosts.insert(cluster.host_peer());
  EXPECT_TRUE(hosts.count("g") > 0) << "g serves a cluster now";
  const std::string displaced = "b";
  ASSERT_EQ(hosts.count(displaced), 0u) << "the weakest serves no cluster now";
  // Its aggregator, unused, is retired after a while.
  Pass(options_.supernodes.retire_after + absl::Seconds(1));
  bool retired = false;
  for (const v1::CoordinatorEvent& e : sinks_[displaced]->events) {
    retired = retired || e.has_retire_supernode();
  }
  EXPECT_TRUE(retired) << displaced << " was not told to retire its aggregator";
  EXPECT_EQ(Metric("shoal_coordinator_supernode_ends_total", "retired"), 1);
  const v1::ListNodesResponse nodes = core_->ListNodes();
  for (const v1::NodeInfo& a : nodes.aggregators()) EXPECT_NE(a.supernode(), displaced);
}

// A cluster's aggregator behind a slow uplink holds up its cluster's rounds: a node with twice
// its upload replaces it, even with less compute; more compute behind a slow link replaces none.
TEST_F(CoordinatorSupernodesTest, AFasterUplinkReplacesAClusterAggregatorMoreComputeDoesNotAlone) {
  ASSERT_TRUE(CreateHierarchical(4, 3).ok());
  JoinWith("a", 1, /*offers=*/false, 100 * kMbit);
  JoinWith("b", 2, true, 100 * kMbit);
  JoinWith("c", 3, true, 100 * kMbit);
  JoinWith("d", 4, true, 100 * kMbit);
  Step();
  ASSERT_THAT(Elected(), UnorderedElementsAre("d"));
  ASSERT_TRUE(Register("d").ok());
  Step();
  ASSERT_EQ(Elected(), (std::set<std::string>{"b", "c"}));
  ASSERT_TRUE(Register("b").ok());
  ASSERT_TRUE(Register("c").ok());
  Step();  // the tree: d the root, clusters on b and c
  ASSERT_EQ(Metric("shoal_coordinator_tree_rebuilds_total"), 1);

  // h: 25 times the weakest's compute behind 5 Mbit/s, the only candidate.
  JoinWith("h", 50, true, 5 * kMbit);
  Pass(options_.supernodes.rebuild_interval);
  EXPECT_TRUE(Elected().empty()) << "more compute behind a slow link is not better";

  // g: less compute than b's double, ten times its upload.
  JoinWith("g", 2.5, true, 1000 * kMbit);
  Step();
  EXPECT_THAT(Elected(), UnorderedElementsAre("g"));
  EXPECT_EQ(Metric("shoal_coordinator_supernode_elections_total", "better"), 1);
  ASSERT_TRUE(Register("g").ok());
  Pass(absl::Seconds(1));
  EXPECT_EQ(Metric("shoal_coordinator_tree_rebuilds_total"), 2);
  std::set<std::string> hosts;
  const v1::TaskStatus status = Status("t");
  for (const v1::ClusterInfo& cluster : status.clusters()) hosts.insert(cluster.host_peer());
  EXPECT_EQ(hosts, (std::set<std::string>{"d", "g", "c"}))
      << "g serves a cluster; b, the least compute of the slower links, none";
}

}  // namespace
}  // namespace shoal::coordinator
