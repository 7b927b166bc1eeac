// The coordinator's side of hierarchical tasks (topology: hierarchical): peers grouped into
// clusters of cluster_size, one registered aggregator per cluster, below a root that serves no
// peer while a child can; each peer told its cluster's aggregator; a round opened at the root (its
// own peers, the children with peers in the round) and at each child (with the root as parent),
// closed children first, then the root, then the children fetch the new version; a lost child moves
// the whole task.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
using core_testing::FakeSink;
using core_testing::Ids;
using core_testing::Initialized;
using core_testing::Spec;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

constexpr char kRoot[] = "127.0.0.1:7001";
constexpr char kChild1[] = "127.0.0.1:7002";
constexpr char kChild2[] = "127.0.0.1:7003";
constexpr char kGrandchild[] = "127.0.0.1:7004";

// The aggregator address each peer was last told (TaskAssigned), and who was asked to store the
// initial model, where.
struct Told {
  std::map<std::string, std::string> assigned;
  std::map<std::string, std::string> initialize;
};

Told WhatWasTold(const std::map<std::string, std::shared_ptr<FakeSink>>& sinks) {
  Told told;
  for (const auto& [id, sink] : sinks) {
    for (const v1::CoordinatorEvent& e : sink->events) {
      if (e.has_task_assigned()) told.assigned[id] = e.task_assigned().aggregator_address();
      if (e.has_initialize_model()) {
        told.initialize[id] = e.initialize_model().aggregator_address();
      }
    }
    sink->events.clear();
  }
  return told;
}

// The calls of one level of a tree run in parallel: tests check the order of levels, and find
// each call by its aggregator. Fails the test when `address` was not called exactly once.
template <typename T>
const T& CallAt(const std::vector<T>& calls, const std::vector<std::string>& addresses,
                const std::string& address) {
  static const T kNone;
  size_t found = calls.size();
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i] != address) continue;
    EXPECT_EQ(found, calls.size()) << address << " called twice";
    found = i;
  }
  EXPECT_LT(found, calls.size()) << address << " not called";
  return found < calls.size() ? calls[found] : kNone;
}

// The calls in `addresses`, grouped as the levels they must come in.
void ExpectLevels(const std::vector<std::string>& addresses,
                  const std::vector<std::set<std::string>>& levels) {
  size_t at = 0;
  for (const std::set<std::string>& level : levels) {
    ASSERT_LE(at + level.size(), addresses.size());
    EXPECT_EQ(std::set<std::string>(addresses.begin() + static_cast<ptrdiff_t>(at),
                                    addresses.begin() + static_cast<ptrdiff_t>(at + level.size())),
              level)
        << "calls " << at << ".." << at + level.size() - 1;
    at += level.size();
  }
  EXPECT_EQ(at, addresses.size());
}

class CoordinatorTreeTest : public CoordinatorCoreTest {
 protected:
  const aggregator::v1::OpenRoundRequest& OpenedAt(const std::string& address) {
    return CallAt(aggregator_.opened, aggregator_.open_addresses, address);
  }
  aggregator::v1::PullModelRequest PullAt(const std::string& address) {
    std::vector<aggregator::v1::PullModelRequest> pulls;
    std::vector<std::string> addresses;
    for (const auto& [a, pull] : aggregator_.pulls) {
      addresses.push_back(a);
      pulls.push_back(pull);
    }
    return CallAt(pulls, addresses, address);
  }

  // Three aggregators and a hierarchical task "t" of four peers in clusters of 2.
  void StartTaskOfFour() {
    ASSERT_TRUE(core_->RegisterAggregator(kRoot).ok());
    ASSERT_TRUE(core_->RegisterAggregator(kChild1).ok());
    ASSERT_TRUE(core_->RegisterAggregator(kChild2).ok());
    common::v1::TaskSpec spec = Spec("t", 4, 2);
    spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
    spec.set_cluster_size(2);
    ASSERT_TRUE(core_->CreateTask(spec).ok());
  }
  // Connects `name`, which measured the root at 20 ms and the children at the times given.
  std::shared_ptr<FakeSink> JoinMeasured(const std::string& name, uint32_t child1_us,
                                         uint32_t child2_us) {
    v1::Hello hello = core_testing::Hello(name);
    for (const auto& [address, us] :
         {std::pair{kRoot, 20000u}, std::pair{kChild1, child1_us}, std::pair{kChild2, child2_us}}) {
      common::v1::AggregatorRtt* rtt = hello.mutable_capacity()->add_aggregator_rtts();
      rtt->set_address(address);
      rtt->set_rtt_us(us);
    }
    auto sink = std::make_shared<FakeSink>();
    EXPECT_TRUE(core_->Connect(hello, /*identity=*/"", sink).ok());
    return sink;
  }

  // Three aggregators, a hierarchical task with clusters of 2, five peers: the task waits for
  // its initial model.
  std::map<std::string, std::shared_ptr<FakeSink>> Start() {
    EXPECT_TRUE(core_->RegisterAggregator(kRoot, {}, "aggregator-0").ok());
    EXPECT_TRUE(core_->RegisterAggregator(kChild1, {}, "aggregator-1").ok());
    EXPECT_TRUE(core_->RegisterAggregator(kChild2, {}, "aggregator-2").ok());
    common::v1::TaskSpec spec = Spec("t", 5, 2);
    spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
    spec.set_cluster_size(2);
    EXPECT_TRUE(core_->CreateTask(spec).ok());
    std::map<std::string, std::shared_ptr<FakeSink>> sinks;
    for (const char* p : {"a", "b", "c", "d", "e"}) sinks[p] = Join(p);
    Step();
    return sinks;
  }
};

TEST_F(CoordinatorTreeTest, PeersAreGroupedIntoClustersOneAggregatorEach) {
  auto sinks = Start();
  const Told told = WhatWasTold(sinks);
  // Clusters of two on the children; the fifth peer finds no free aggregator and joins the
  // smaller cluster (the first of two equal ones), over its size.
  EXPECT_EQ(told.assigned,
            (std::map<std::string, std::string>{
                {"a", kChild1}, {"b", kChild1}, {"c", kChild2}, {"d", kChild2}, {"e", kChild1}}));
  // The initial model goes to the root, whatever the initializer's cluster.
  ASSERT_EQ(told.initialize.size(), 1u);
  EXPECT_EQ(told.initialize.begin()->second, kRoot);

  const v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.aggregator(), kRoot);
  ASSERT_EQ(status.clusters_size(), 3);
  EXPECT_EQ(status.clusters(0).aggregator(), kRoot);
  EXPECT_EQ(status.clusters(0).level(), 0u);
  EXPECT_TRUE(status.clusters(0).peers().empty()) << "the root serves no peer itself";
  EXPECT_EQ(status.clusters(1).child_id(), "aggregator-1");
  EXPECT_EQ(status.clusters(1).level(), 1u);
  EXPECT_THAT(Ids(status.clusters(1).peers()), ElementsAre("a", "b", "e"));
  EXPECT_THAT(Ids(status.clusters(2).peers()), ElementsAre("c", "d"));

  // Each aggregator was told its members: the root all five, a child its cluster.
  std::map<std::string, std::set<std::string>> members;
  for (size_t i = 0; i < aggregator_.members.size(); ++i) {
    std::set<std::string> ids;
    for (const auto& [id, token] : aggregator_.members[i].session_tokens()) ids.insert(id);
    members[aggregator_.member_addresses[i]] = ids;
  }
  EXPECT_EQ(members[kRoot], (std::set<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(members[kChild1], (std::set<std::string>{"a", "b", "e"}));
  EXPECT_EQ(members[kChild2], (std::set<std::string>{"c", "d"}));
}

// Peers that measured their round trips (Capacity.aggregator_rtts) join the cluster of their
// nearest aggregator, and open a new cluster rather than join a far one: two regions, A near
// kChild1, B near kChild2, joining alternately (by arrival: a and b in kChild1, c and d in
// kChild2).
TEST_F(CoordinatorTreeTest, PeersJoinTheClusterOfTheirNearestAggregator) {
  StartTaskOfFour();
  std::map<std::string, std::shared_ptr<FakeSink>> sinks;
  sinks["a"] = JoinMeasured("a", 300, 40000);   // A: a new cluster on the nearest free aggregator
  sinks["b"] = JoinMeasured("b", 41000, 400);   // B: kChild1 has room but is far: a new cluster
  sinks["c"] = JoinMeasured("c", 39000, 1200);  // B: the nearer cluster with room
  sinks["d"] = JoinMeasured("d", 350, 42000);   // A
  Step();
  EXPECT_EQ(WhatWasTold(sinks).assigned,
            (std::map<std::string, std::string>{
                {"a", kChild1}, {"b", kChild2}, {"c", kChild2}, {"d", kChild1}}));

  // The aggregators the peers measure: all registered, those serving the fewest active tasks
  // first (all three serve "t").
  EXPECT_THAT(core_->AggregatorsToMeasure(), UnorderedElementsAre(kRoot, kChild1, kChild2));
  ASSERT_TRUE(core_->RegisterAggregator(kGrandchild).ok());
  EXPECT_EQ(core_->AggregatorsToMeasure().front(), kGrandchild);
  EXPECT_THAT(core_->AggregatorsToMeasure(/*limit=*/2), ::testing::SizeIs(2));

  // Bad round trips are refused with the Hello.
  v1::Hello bad = core_testing::Hello("x");
  bad.mutable_capacity()->add_aggregator_rtts()->set_rtt_us(10);
  absl::StatusOr<std::string> refused =
      core_->Connect(bad, /*identity=*/"", std::make_shared<FakeSink>());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  bad = core_testing::Hello("x");
  for (int i = 0; i < 65; ++i) {
    bad.mutable_capacity()->add_aggregator_rtts()->set_address(absl::StrCat("127.0.0.1:", i + 1));
  }
  refused = core_->Connect(bad, /*identity=*/"", std::make_shared<FakeSink>());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("at most 64"));
}

// Round trips within a millisecond of each other (one network) leave the order of arrival and
// the choice by load and compute.
TEST_F(CoordinatorTreeTest, RoundTripsOnOneNetworkLeaveTheOrderOfArrival) {
  StartTaskOfFour();
  std::map<std::string, std::shared_ptr<FakeSink>> sinks;
  for (const char* name : {"a", "b", "c", "d"}) sinks[name] = JoinMeasured(name, 900, 300);
  Step();
  EXPECT_EQ(WhatWasTold(sinks).assigned,
            (std::map<std::string, std::string>{
                {"a", kChild1}, {"b", kChild1}, {"c", kChild2}, {"d", kChild2}}));
}

TEST_F(CoordinatorTreeTest, ARoundRunsOnTheTree) {
  auto sinks = Start();
  const Told told = WhatWasTold(sinks);
  ASSERT_TRUE(core_->OnMessage(told.initialize.begin()->first, Initialized("t")).ok());
  Step();
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);
  ASSERT_EQ(aggregator_.opened.size(), 3u);
  ExpectLevels(aggregator_.open_addresses, {{kRoot}, {kChild1, kChild2}});
  const aggregator::v1::OpenRoundRequest& root = OpenedAt(kRoot);
  EXPECT_TRUE(root.expected_peers().empty());
  EXPECT_THAT(Ids(root.expected_children()), ElementsAre("aggregator-1", "aggregator-2"));
  EXPECT_FALSE(root.has_parent());
  const aggregator::v1::OpenRoundRequest& child = OpenedAt(kChild1);
  EXPECT_THAT(Ids(child.expected_peers()), ElementsAre("a", "b", "e"));
  EXPECT_EQ(child.parent().address(), kRoot);
  EXPECT_EQ(child.parent().child(), "aggregator-1");
  EXPECT_EQ(child.round(), 1u);
  EXPECT_EQ(child.base_version(), root.base_version());
  EXPECT_THAT(Ids(OpenedAt(kChild2).expected_peers()), ElementsAre("c", "d"));

  aggregator_.contributors = {"a", "b", "c", "d", "e"};
  for (const char* p : {"a", "b", "c", "d", "e"}) Accept("t", 1, p);
  Step();
  // Children first (each sends the root its partial sum), then the root; then each child
  // fetches the version the root published.
  ExpectLevels(aggregator_.close_addresses, {{kChild1, kChild2}, {kRoot}});
  ASSERT_EQ(aggregator_.pulls.size(), 2u);
  const aggregator::v1::PullModelRequest pull = PullAt(kChild1);
  // (The fake publishes a version per CloseRound: the root's answer is the newest.)
  EXPECT_EQ(pull.version(), aggregator_.version);
  EXPECT_EQ(pull.parent().address(), kRoot);
  EXPECT_EQ(pull.parent().child(), "aggregator-1");
  EXPECT_EQ(PullAt(kChild2).parent().child(), "aggregator-2");
  const v1::TaskStatus status = Status("t");
  ASSERT_GE(status.history_size(), 1);
  EXPECT_THAT(Ids(status.history(0).participants()), UnorderedElementsAre("a", "b", "c", "d", "e"));
  EXPECT_EQ(status.model_version(), aggregator_.version);
}

TEST_F(CoordinatorTreeTest, ALostChildMovesTheWholeTask) {
  auto sinks = Start();
  WhatWasTold(sinks);
  aggregator_.BreakWatches(kChild1, absl::UnavailableError("gone"));
  Step();
  // Placed again on the two aggregators left: the root and one child, which takes every peer
  // (over its size: there is no other free aggregator).
  const Told told = WhatWasTold(sinks);
  EXPECT_EQ(told.assigned.size(), 5u);
  for (const auto& [peer, address] : told.assigned) EXPECT_EQ(address, kChild2) << peer;
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 2);
  EXPECT_EQ(status.clusters(1).aggregator(), kChild2);
}

// With fanout 2, the third cluster goes one level down, below the first child: rounds open from
// the root down, close from the deepest up, and each node fetches the new version from its own
// parent.
TEST_F(CoordinatorTreeTest, ClustersBeyondTheFanoutGoOneLevelDeeper) {
  ASSERT_TRUE(core_->RegisterAggregator(kRoot, {}, "aggregator-0").ok());
  ASSERT_TRUE(core_->RegisterAggregator(kChild1, {}, "aggregator-1").ok());
  ASSERT_TRUE(core_->RegisterAggregator(kChild2, {}, "aggregator-2").ok());
  ASSERT_TRUE(core_->RegisterAggregator(kGrandchild, {}, "aggregator-3").ok());
  common::v1::TaskSpec spec = Spec("t", 6, 2);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  spec.set_fanout(2);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  std::map<std::string, std::shared_ptr<FakeSink>> sinks;
  for (const char* p : {"a", "b", "c", "d", "e", "f"}) sinks[p] = Join(p);
  Step();
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 4);
  EXPECT_EQ(status.clusters(3).aggregator(), kGrandchild);
  EXPECT_EQ(status.clusters(3).level(), 2u);
  EXPECT_EQ(status.clusters(3).parent(), kChild1);
  EXPECT_THAT(Ids(status.clusters(3).peers()), ElementsAre("e", "f"));
  EXPECT_EQ(status.clusters(2).parent(), kRoot);

  const Told told = WhatWasTold(sinks);
  ASSERT_TRUE(core_->OnMessage(told.initialize.begin()->first, Initialized("t")).ok());
  Step();
  ExpectLevels(aggregator_.open_addresses, {{kRoot}, {kChild1, kChild2}, {kGrandchild}});
  EXPECT_THAT(Ids(OpenedAt(kRoot).expected_children()),
              ElementsAre("aggregator-1", "aggregator-2"));
  EXPECT_THAT(Ids(OpenedAt(kChild1).expected_children()), ElementsAre("aggregator-3"));
  EXPECT_EQ(OpenedAt(kChild1).parent().address(), kRoot);
  EXPECT_EQ(OpenedAt(kGrandchild).parent().address(), kChild1);
  EXPECT_EQ(OpenedAt(kGrandchild).parent().child(), "aggregator-3");

  aggregator_.contributors = {"a", "b", "c", "d", "e", "f"};
  for (const char* p : {"a", "b", "c", "d", "e", "f"}) Accept("t", 1, p);
  Step();
  ExpectLevels(aggregator_.close_addresses, {{kGrandchild}, {kChild1, kChild2}, {kRoot}});
  std::vector<std::string> pulled;
  for (const auto& [address, pull] : aggregator_.pulls) pulled.push_back(address);
  ExpectLevels(pulled, {{kChild1, kChild2}, {kGrandchild}});
  EXPECT_EQ(PullAt(kGrandchild).parent().address(), kChild1);
}

TEST_F(CoordinatorTreeTest, TheRootServesPeersOnlyWhenItIsTheOnlyAggregator) {
  ASSERT_TRUE(core_->RegisterAggregator(kRoot).ok());
  common::v1::TaskSpec spec = Spec("t", 3, 1);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  std::map<std::string, std::shared_ptr<FakeSink>> sinks;
  for (const char* p : {"a", "b", "c"}) sinks[p] = Join(p);
  Step();
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 1);
  EXPECT_THAT(Ids(status.clusters(0).peers()), ElementsAre("a", "b", "c"));
  // A child's identity is its address when it registered without a certificate.
  ASSERT_TRUE(core_->RegisterAggregator(kChild1).ok());
  sinks["d"] = Join("d");
  Step();
  ASSERT_EQ(Status("t").clusters_size(), 2);
  EXPECT_EQ(Status("t").clusters(1).child_id(), kChild1);
  EXPECT_THAT(Ids(Status("t").clusters(1).peers()), ElementsAre("d"));
}

// Aggregators that share one certificate (deploy/k8s) are children by certificate and address.
TEST_F(CoordinatorTreeTest, ASharedCertificateNamesChildrenByAddress) {
  ASSERT_TRUE(core_->RegisterAggregator(kRoot, {}, "aggregator").ok());
  ASSERT_TRUE(core_->RegisterAggregator(kChild1, {}, "aggregator").ok());
  common::v1::TaskSpec spec = Spec("t", 1, 1);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  auto a = Join("a");
  Step();
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 2);
  EXPECT_EQ(status.clusters(1).child_id(), absl::StrCat("aggregator@", kChild1));
}

TEST_F(CoordinatorTreeTest, StragglersPushLateToTheirOwnCluster) {
  // A root and two clusters; the round's late peers (stragglers in asynchronous contribution)
  // go to their cluster's aggregator with the staleness settings, like the peers on time; a
  // cluster whose only peer is late still takes part.
  AggregatorTree tree;
  tree.hierarchical = true;
  tree.nodes = {{kRoot, "", {}, 0, 0},
                {kChild1, "aggregator-1", {"a", "b"}, 0, 1},
                {kChild2, "aggregator-2", {"c"}, 0, 1}};
  AggregatorWork work;
  work.open.set_task("t");
  work.open.set_round(4);
  work.open.add_expected_peers("a");
  work.open.add_late_peers("b");
  work.open.add_late_peers("c");
  work.open.mutable_late_staleness()->set_max_staleness(3);
  AggregatorWorkRunner runner(aggregator_, *store_, calls_, transfers_, clock_, *metrics_, {});
  bool done = false;
  runner.Run("t", tree, work, [&](WorkResult result) {
    EXPECT_TRUE(result.status.ok()) << result.status;
    done = true;
  });
  RunWork();
  runner.Drain();
  ASSERT_TRUE(done);
  const aggregator::v1::OpenRoundRequest& root = OpenedAt(kRoot);
  EXPECT_TRUE(root.expected_peers().empty());
  EXPECT_TRUE(root.late_peers().empty());
  EXPECT_FALSE(root.has_late_staleness());
  EXPECT_THAT(Ids(root.expected_children()), ElementsAre("aggregator-1", "aggregator-2"));
  const aggregator::v1::OpenRoundRequest& one = OpenedAt(kChild1);
  EXPECT_THAT(Ids(one.expected_peers()), ElementsAre("a"));
  EXPECT_THAT(Ids(one.late_peers()), ElementsAre("b"));
  EXPECT_EQ(one.late_staleness().max_staleness(), 3u);
  const aggregator::v1::OpenRoundRequest& two = OpenedAt(kChild2);
  EXPECT_TRUE(two.expected_peers().empty());
  EXPECT_THAT(Ids(two.late_peers()), ElementsAre("c"));
  EXPECT_EQ(two.parent().address(), kRoot);
}

TEST_F(CoordinatorTreeTest, WithSecureAggregationEachClusterIsOneSecureRound) {
  // A root with one peer of its own, a cluster of three and a cluster of two: the cluster of
  // three is one secure round with its own peers' keys; the cluster of two and the root's peer
  // sit the round out; the root adds the sum in a plain round.
  AggregatorTree tree;
  tree.hierarchical = true;
  tree.nodes = {{kRoot, "", {}, 0, 0},
                {kChild1, "aggregator-1", {"a", "b", "c"}, 0, 1},
                {kChild2, "aggregator-2", {"d", "e"}, 0, 1}};
  AggregatorWork work;
  work.open.set_task("t");
  work.open.set_round(1);
  aggregator::v1::SecureAggregationSettings& secure = *work.open.mutable_secure_aggregation();
  secure.set_enabled(true);
  secure.set_clip_norm(1);
  for (const char* p : {"a", "b", "c", "d", "e", "f"}) {
    work.open.add_expected_peers(p);
    (*secure.mutable_identity_keys())[p] = std::string(32, p[0]);
  }
  AggregatorWorkRunner runner(aggregator_, *store_, calls_, transfers_, clock_, *metrics_, {});
  std::optional<WorkResult> done;
  runner.Run("t", tree, work, [&](WorkResult result) { done = std::move(result); });
  RunWork();
  runner.Drain();
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  // "f" is in no cluster: it would push to the root.
  EXPECT_THAT(Ids(done->work.open.expected_peers()), ElementsAre("a", "b", "c"));
  ASSERT_EQ(done->secure_groups.size(), 1u);
  EXPECT_THAT(done->secure_groups[0], ElementsAre("a", "b", "c"));
  const aggregator::v1::OpenRoundRequest& root = OpenedAt(kRoot);
  EXPECT_TRUE(root.expected_peers().empty());
  EXPECT_FALSE(root.secure_aggregation().enabled());
  EXPECT_THAT(Ids(root.expected_children()), ElementsAre("aggregator-1", "aggregator-2"));
  const aggregator::v1::OpenRoundRequest& one = OpenedAt(kChild1);
  EXPECT_THAT(Ids(one.expected_peers()), ElementsAre("a", "b", "c"));
  EXPECT_TRUE(one.secure_aggregation().enabled());
  EXPECT_EQ(one.secure_aggregation().identity_keys_size(), 3);
  EXPECT_EQ(one.secure_aggregation().identity_keys().at("b"), std::string(32, 'b'));
  EXPECT_EQ(one.parent().address(), kRoot);
  // The cluster of two took no part.
  for (const std::string& address : aggregator_.open_addresses) EXPECT_NE(address, kChild2);
}

TEST_F(CoordinatorTreeTest, WithDpEveryNodeIsToldTheWholeRoundsPeers) {
  // Peer-level DP: the root divides by the peers of the whole round and makes up the missing
  // ones' noise shares; a secure cluster sizes its peers' shares by the same count. With secure
  // aggregation the peers that sit the round out are not counted.
  AggregatorTree tree;
  tree.hierarchical = true;
  tree.nodes = {{kRoot, "", {}, 0, 0},
                {kChild1, "aggregator-1", {"a", "b", "c"}, 0, 1},
                {kChild2, "aggregator-2", {"d", "e"}, 0, 1}};
  for (const bool secure : {false, true}) {
    AggregatorWork work;
    work.open.set_task(secure ? "secure" : "plain");
    work.open.set_round(1);
    work.open.mutable_dp()->set_level(common::v1::DP_LEVEL_PEER);
    work.open.mutable_dp()->set_clip_norm(1);
    if (secure) {
      work.open.mutable_secure_aggregation()->set_enabled(true);
      work.open.mutable_secure_aggregation()->set_clip_norm(1);
    }
    for (const char* p : {"a", "b", "c", "d", "e", "f"}) {
      work.open.add_expected_peers(p);
      if (secure) {
        (*work.open.mutable_secure_aggregation()->mutable_identity_keys())[p] = std::string(32, *p);
      }
    }
    aggregator_.opened.clear();
    aggregator_.open_addresses.clear();
    AggregatorWorkRunner runner(aggregator_, *store_, calls_, transfers_, clock_, *metrics_, {});
    std::optional<WorkResult> done;
    runner.Run(work.open.task(), tree, work, [&](WorkResult result) { done = std::move(result); });
    RunWork();
    runner.Drain();
    ASSERT_TRUE(done.has_value());
    ASSERT_TRUE(done->status.ok()) << done->status;
    const uint32_t peers = secure ? 3 : 6;
    EXPECT_EQ(done->work.open.expected_peers_size(), static_cast<int>(peers)) << secure;
    EXPECT_EQ(OpenedAt(kRoot).dp_round_peers(), peers) << secure;
    EXPECT_EQ(OpenedAt(kRoot).dp().level(), common::v1::DP_LEVEL_PEER) << secure;
    EXPECT_EQ(OpenedAt(kChild1).dp_round_peers(), peers) << secure;
    if (!secure) {
      EXPECT_EQ(OpenedAt(kChild2).dp_round_peers(), peers);
    }
  }
}

TEST_F(CoordinatorTreeTest, FlatTasksShowNoClusters) {
  auto sinks = StartTask(Spec("flat", 2, 1), {"a", "b"});
  EXPECT_EQ(Status("flat").clusters_size(), 0);
  EXPECT_TRUE(aggregator_.pulls.empty());
}

}  // namespace
}  // namespace shoal::coordinator
