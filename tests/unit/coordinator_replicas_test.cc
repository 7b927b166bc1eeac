// The coordinator's side of replicas (TaskSpec.replicas): each cluster of a hierarchical task
// gets backups from the aggregators left free; a round is opened at the backups first (standby
// rounds), then at the primaries with their backups; peers are told their cluster's aggregators;
// a lost primary is replaced by its backup and the round goes on there (no restart, no peer
// told to move); a lost backup is only dropped. With secure aggregation a primary copies nothing
// and its promoted backup is opened again as the cluster's secure round.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

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
constexpr char kOne[] = "127.0.0.1:7002";
constexpr char kTwo[] = "127.0.0.1:7003";
constexpr char kSpareA[] = "127.0.0.1:7004";
constexpr char kSpareB[] = "127.0.0.1:7005";
constexpr char kSpareC[] = "127.0.0.1:7006";

const std::map<std::string, std::string> kIdentities = {
    {kRoot, "aggregator-0"},   {kOne, "aggregator-1"},    {kTwo, "aggregator-2"},
    {kSpareA, "aggregator-3"}, {kSpareB, "aggregator-4"}, {kSpareC, "aggregator-5"}};

class CoordinatorReplicasTest : public CoordinatorCoreTest {
 protected:
  double Metric(const std::string& name) {
    for (const auto& family : registry_.Collect()) {
      if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
    }
    return -1;
  }
  double Gauge(const std::string& name) {
    for (const auto& family : registry_.Collect()) {
      if (family.name == name && !family.metric.empty()) return family.metric[0].gauge.value;
    }
    return -1;
  }
  // The OpenRound calls made at `address`, in order.
  std::vector<aggregator::v1::OpenRoundRequest> OpensAt(const std::string& address) {
    std::vector<aggregator::v1::OpenRoundRequest> opens;
    for (size_t i = 0; i < aggregator_.opened.size(); ++i) {
      if (aggregator_.open_addresses[i] == address) opens.push_back(aggregator_.opened[i]);
    }
    return opens;
  }

  // Five aggregators (a root, two clusters, and each cluster's backup; with `root_backup` a
  // sixth, the root's), four peers in clusters of two, replicas 2; the initial model stored, so
  // round 1 is open.
  std::map<std::string, std::shared_ptr<FakeSink>> Start(bool root_backup = false) {
    EXPECT_TRUE(core_->RegisterAggregator(kRoot, {}, "aggregator-0").ok());
    EXPECT_TRUE(core_->RegisterAggregator(kOne, {}, "aggregator-1").ok());
    EXPECT_TRUE(core_->RegisterAggregator(kTwo, {}, "aggregator-2").ok());
    common::v1::TaskSpec spec = Spec("t", 4, 2);
    spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
    spec.set_cluster_size(2);
    spec.set_replicas(2);
    EXPECT_TRUE(core_->CreateTask(spec).ok());
    std::map<std::string, std::shared_ptr<FakeSink>> sinks;
    for (const char* p : {"a", "b", "c", "d"}) sinks[p] = Join(p);
    Step();
    // Clusters come first: the third aggregator, the first cluster's backup after the first
    // join, serves the second cluster once the first is full. Their backups come from
    // aggregators that register later.
    EXPECT_EQ(Status("t").clusters_size(), 3);
    EXPECT_EQ(Status("t").clusters(1).backups_size(), 0);
    EXPECT_TRUE(core_->RegisterAggregator(kSpareA, {}, "aggregator-3").ok());
    EXPECT_TRUE(core_->RegisterAggregator(kSpareB, {}, "aggregator-4").ok());
    if (root_backup) {
      EXPECT_TRUE(core_->RegisterAggregator(kSpareC, {}, "aggregator-5").ok());
    }
    Step();
    std::string initializer;
    for (const auto& [id, sink] : sinks) {
      for (const v1::CoordinatorEvent& e : sink->events) {
        if (e.has_initialize_model()) initializer = id;
      }
    }
    EXPECT_FALSE(initializer.empty());
    EXPECT_TRUE(core_->OnMessage(initializer, Initialized("t")).ok());
    Step();
    return sinks;
  }
};

TEST_F(CoordinatorReplicasTest, EachClusterGetsABackupThatOpensAStandbyRound) {
  auto sinks = Start();
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 3);
  EXPECT_EQ(status.clusters(0).backups_size(), 0) << "the root has no replica";
  ASSERT_EQ(status.clusters(1).backups_size(), 1);
  ASSERT_EQ(status.clusters(2).backups_size(), 1);
  const std::string one = status.clusters(1).aggregator();
  const std::string backup_one = status.clusters(1).backups(0);
  const std::string backup_two = status.clusters(2).backups(0);
  EXPECT_THAT((std::set<std::string>{backup_one, backup_two}),
              UnorderedElementsAre(kSpareA, kSpareB));
  EXPECT_EQ(Metric("shoal_coordinator_backups_assigned_total"), 3);  // kTwo's for a while
  EXPECT_EQ(Gauge("shoal_coordinator_backups_missing"), 1) << "the root's: none left for it";
  // A backup forgets what it kept of the task, then learns its cluster's members.
  EXPECT_THAT(aggregator_.released, ::testing::IsSupersetOf({"t", "t"}));
  std::map<std::string, std::set<std::string>> members;
  for (size_t i = 0; i < aggregator_.members.size(); ++i) {
    for (const auto& [id, token] : aggregator_.members[i].session_tokens()) {
      members[aggregator_.member_addresses[i]].insert(id);
    }
  }
  EXPECT_EQ(members[backup_one], members[one]);
  EXPECT_EQ(members[one].size(), 2u);

  // Round 1: the root, then the backups (standby), then the clusters' primaries.
  ASSERT_EQ(aggregator_.open_addresses.size(), 5u);
  EXPECT_EQ(aggregator_.open_addresses[0], kRoot);
  EXPECT_EQ(std::set<std::string>(aggregator_.open_addresses.begin() + 1,
                                  aggregator_.open_addresses.begin() + 3),
            (std::set<std::string>{kSpareA, kSpareB}));
  const aggregator::v1::OpenRoundRequest root = OpensAt(kRoot).at(0);
  ASSERT_EQ(root.child_backups_size(), 2);
  const aggregator::v1::OpenRoundRequest standby = OpensAt(backup_one).at(0);
  const aggregator::v1::OpenRoundRequest primary = OpensAt(one).at(0);
  EXPECT_EQ(standby.standby_for(), "aggregator-1");
  EXPECT_TRUE(standby.backups().empty());
  EXPECT_EQ(Ids(standby.expected_peers()), Ids(primary.expected_peers()));
  EXPECT_EQ(standby.parent().child(), "aggregator-1");
  EXPECT_THAT(Ids(primary.backups()), ElementsAre(backup_one));
  EXPECT_TRUE(primary.standby_for().empty());
  bool named = false;
  for (const aggregator::v1::ChildBackup& b : root.child_backups()) {
    if (b.child() == "aggregator-1") {
      named = true;
      EXPECT_EQ(b.backup(), backup_one == kSpareA ? "aggregator-3" : "aggregator-4");
    }
  }
  EXPECT_TRUE(named);

  // Each peer is told its cluster's aggregators, primary first.
  for (const std::string& peer : Ids(status.clusters(1).peers())) {
    std::vector<std::string> told;
    for (const v1::CoordinatorEvent& e : sinks[peer]->events) {
      if (e.has_round_started()) told = Ids(e.round_started().aggregators());
    }
    EXPECT_THAT(told, ElementsAre(one, backup_one)) << peer;
  }
}

TEST_F(CoordinatorReplicasTest, ALostPrimaryIsReplacedByItsBackupAndTheRoundGoesOn) {
  auto sinks = Start();
  v1::TaskStatus status = Status("t");
  const std::string one = status.clusters(1).aggregator();
  const std::string backup_one = status.clusters(1).backups(0);
  for (auto& [id, sink] : sinks) sink->events.clear();
  aggregator_.Accept("t", 1, Ids(status.clusters(1).peers())[0]);
  aggregator_.BreakWatches(one, absl::UnavailableError("gone"));
  Step();
  status = Status("t");
  EXPECT_EQ(status.round(), 1u) << "the round goes on";
  EXPECT_EQ(status.clusters(1).aggregator(), backup_one);
  EXPECT_EQ(status.clusters(1).child_id(), "aggregator-1") << "it takes the primary's place";
  EXPECT_EQ(status.clusters(1).backups_size(), 0) << "no aggregator left for a new backup";
  EXPECT_EQ(Metric("shoal_coordinator_failovers_total"), 1);
  EXPECT_EQ(Gauge("shoal_coordinator_backups_missing"), 2);  // the root's and this cluster's
  // The backup's standby round is opened again as the cluster's round.
  const std::vector<aggregator::v1::OpenRoundRequest> opens = OpensAt(backup_one);
  ASSERT_EQ(opens.size(), 2u);
  EXPECT_EQ(opens[0].standby_for(), "aggregator-1");
  EXPECT_TRUE(opens[1].standby_for().empty());
  EXPECT_EQ(opens[1].round(), 1u);
  EXPECT_EQ(Ids(opens[1].expected_peers()), Ids(opens[0].expected_peers()));
  // No peer is moved (a TaskAssigned would abandon its round).
  for (auto& [id, sink] : sinks) {
    for (const v1::CoordinatorEvent& e : sink->events) {
      EXPECT_FALSE(e.has_task_assigned()) << id;
    }
  }

  // The round closes at the backup, then the root.
  aggregator_.contributors = {"a", "b", "c", "d"};
  for (const char* p : {"a", "b", "c", "d"}) Accept("t", 1, p);
  Step();
  ASSERT_EQ(aggregator_.close_addresses.size(), 3u);
  EXPECT_EQ(std::set<std::string>(aggregator_.close_addresses.begin(),
                                  aggregator_.close_addresses.begin() + 2),
            (std::set<std::string>{backup_one, status.clusters(2).aggregator()}));
  EXPECT_EQ(aggregator_.close_addresses[2], kRoot);
  EXPECT_EQ(Status("t").history_size(), 1);
}

// A task that ends is freed at every aggregator that holds some of it: the root, the clusters'
// primaries and their backups (a backup keeps the cluster's base model and a standby round).
TEST_F(CoordinatorReplicasTest, AnEndedTaskIsReleasedAtItsBackupsToo) {
  Start();
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 3);
  std::set<std::string> holders;
  for (const v1::ClusterInfo& c : status.clusters()) {
    holders.insert(c.aggregator());
    holders.insert(c.backups().begin(), c.backups().end());
  }
  ASSERT_EQ(holders.size(), 5u);
  aggregator_.released_addresses.clear();
  ASSERT_TRUE(core_->StopTask("t").ok());
  Step();
  EXPECT_EQ(std::set<std::string>(aggregator_.released_addresses.begin(),
                                  aggregator_.released_addresses.end()),
            holders);
}

// With secure aggregation a cluster's primary copies nothing (its open names no backups) while
// its backup holds a standby round; promoted, the standby is opened again as the cluster's
// secure round (the same peers and identity keys, no standby_for, no backups): the backup
// starts that secure round again from its first step.
TEST_F(CoordinatorReplicasTest, ASecureClustersBackupIsOpenedAgainAsItsSecureRound) {
  ASSERT_TRUE(core_->RegisterAggregator(kRoot, {}, "aggregator-0").ok());
  ASSERT_TRUE(core_->RegisterAggregator(kOne, {}, "aggregator-1").ok());
  common::v1::TaskSpec spec = Spec("t", 3, 2);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(3);
  spec.set_replicas(2);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(1.0);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  std::map<std::string, std::shared_ptr<FakeSink>> sinks;
  for (const std::string p : {"a", "b", "c"}) {
    sinks[p] = std::make_shared<FakeSink>();
    v1::Hello hello = core_testing::Hello(p);
    hello.set_identity_public_key("key-" + p);
    ASSERT_TRUE(core_->Connect(hello, /*identity=*/"", sinks[p]).ok());
  }
  Step();
  ASSERT_TRUE(core_->RegisterAggregator(kSpareA, {}, "aggregator-3").ok());
  Step();
  for (const auto& [id, sink] : sinks) {
    for (const v1::CoordinatorEvent& e : sink->events) {
      if (e.has_initialize_model()) {
        ASSERT_TRUE(core_->OnMessage(id, Initialized("t")).ok());
      }
    }
  }
  Step();
  v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 2) << status.ShortDebugString();
  ASSERT_EQ(status.clusters(1).aggregator(), kOne);
  ASSERT_THAT(Ids(status.clusters(1).backups()), ElementsAre(kSpareA));
  const aggregator::v1::OpenRoundRequest primary = OpensAt(kOne).at(0);
  const aggregator::v1::OpenRoundRequest standby = OpensAt(kSpareA).at(0);
  EXPECT_TRUE(primary.secure_aggregation().enabled());
  EXPECT_TRUE(primary.backups().empty()) << "a secure primary copies nothing";
  EXPECT_TRUE(primary.replica_id().empty());
  EXPECT_EQ(standby.standby_for(), "aggregator-1");
  EXPECT_TRUE(standby.secure_aggregation().enabled());
  EXPECT_EQ(Ids(standby.expected_peers()), Ids(primary.expected_peers()));

  aggregator_.BreakWatches(kOne, absl::UnavailableError("gone"));
  Step();
  EXPECT_EQ(Status("t").clusters(1).aggregator(), kSpareA);
  EXPECT_EQ(Status("t").round(), 1u);
  const std::vector<aggregator::v1::OpenRoundRequest> opens = OpensAt(kSpareA);
  ASSERT_EQ(opens.size(), 2u);
  const aggregator::v1::OpenRoundRequest& promoted = opens[1];
  EXPECT_EQ(promoted.round(), 1u);
  EXPECT_TRUE(promoted.standby_for().empty());
  EXPECT_TRUE(promoted.backups().empty());
  EXPECT_EQ(promoted.parent().child(), "aggregator-1") << "it keeps the primary's place";
  EXPECT_THAT(Ids(promoted.expected_peers()), ElementsAre("a", "b", "c"));
  EXPECT_EQ(promoted.secure_aggregation().identity_keys_size(), 3);
  EXPECT_EQ(promoted.secure_aggregation().identity_keys().at("b"), "key-b");
}

TEST_F(CoordinatorReplicasTest, ABackupWithoutTheRoundCannotTakeItOver) {
  // The backups' standby opens fail: the primaries copy to none, and the backup of a lost
  // primary, which lacks the updates it acknowledged, does not take the round over: the task
  // starts over on a new tree instead.
  aggregator_.open_fails_at = {kSpareA, kSpareB};
  auto sinks = Start();
  v1::TaskStatus status = Status("t");
  const std::string one = status.clusters(1).aggregator();
  ASSERT_EQ(status.clusters(1).backups_size(), 1);
  EXPECT_TRUE(OpensAt(one).at(0).backups().empty());
  for (auto& [id, sink] : sinks) sink->events.clear();
  aggregator_.BreakWatches(one, absl::UnavailableError("gone"));
  Step();
  EXPECT_EQ(Metric("shoal_coordinator_failovers_total"), 1);
  bool moved = false;
  for (auto& [id, sink] : sinks) {
    for (const v1::CoordinatorEvent& e : sink->events) moved = moved || e.has_task_assigned();
  }
  EXPECT_TRUE(moved) << "the task started over on a new tree";
  status = Status("t");
  for (const v1::ClusterInfo& c : status.clusters()) EXPECT_NE(c.aggregator(), one);
}

TEST_F(CoordinatorReplicasTest, ALostBackupIsDroppedAndAPrimaryWithoutOneMovesTheTask) {
  auto sinks = Start();
  v1::TaskStatus status = Status("t");
  const std::string two = status.clusters(2).aggregator();
  const std::string backup_two = status.clusters(2).backups(0);
  // A backup is not watched: it is lost when its registration expires (15 s), the others
  // registering again meanwhile.
  v1::PeerMessage heartbeat;
  heartbeat.mutable_heartbeat();
  for (int second = 0; second < 16; ++second) {
    clock_.Advance(absl::Seconds(1));
    for (const auto& [id, sink] : sinks) EXPECT_TRUE(core_->OnMessage(id, heartbeat).ok());
    for (const auto& [address, identity] : kIdentities) {
      if (address == backup_two) continue;
      EXPECT_TRUE(core_->RegisterAggregator(address, {}, identity).ok());
    }
    Step();
  }
  status = Status("t");
  EXPECT_EQ(status.clusters(2).aggregator(), two);
  EXPECT_EQ(status.clusters(2).backups_size(), 0);
  EXPECT_EQ(Metric("shoal_coordinator_failovers_total"), 0);
  // Its primary, with no backup left, is lost as before: the task moves to a new tree.
  aggregator_.BreakWatches(two, absl::UnavailableError("gone"));
  Step();
  status = Status("t");
  for (const v1::ClusterInfo& c : status.clusters()) EXPECT_NE(c.aggregator(), two);
}

TEST_F(CoordinatorReplicasTest, TheRootsBackupTakesOverALostRootAndTheRoundGoesOn) {
  auto sinks = Start(/*root_backup=*/true);
  v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.clusters_size(), 3);
  ASSERT_EQ(status.clusters(0).backups_size(), 1) << "clusters first, then the root";
  ASSERT_EQ(status.clusters(1).backups_size(), 1);
  ASSERT_EQ(status.clusters(2).backups_size(), 1);
  EXPECT_EQ(Gauge("shoal_coordinator_backups_missing"), 0);
  const std::string backup = status.clusters(0).backups(0);
  const std::string backup_id = kIdentities.at(backup);

  // Round 1: the root first, naming its backup as a child (it fetches the root's versions);
  // the backup's standby round, its versions from the root; the root again, copying to it.
  const std::vector<aggregator::v1::OpenRoundRequest> at_root = OpensAt(kRoot);
  ASSERT_EQ(at_root.size(), 2u);
  EXPECT_EQ(aggregator_.open_addresses[0], kRoot);
  EXPECT_THAT(Ids(at_root[0].expected_children()), ::testing::Contains(backup_id));
  EXPECT_TRUE(at_root[0].backups().empty());
  EXPECT_THAT(Ids(at_root[1].backups()), ElementsAre(backup));
  EXPECT_EQ(at_root[1].replica_id(), "aggregator-0");
  std::vector<aggregator::v1::OpenRoundRequest> at_backup = OpensAt(backup);
  ASSERT_EQ(at_backup.size(), 1u);
  EXPECT_EQ(at_backup[0].standby_for(), "aggregator-0");
  EXPECT_EQ(at_backup[0].parent().address(), kRoot);
  EXPECT_EQ(at_backup[0].parent().child(), backup_id);

  // The root is lost mid-round: its backup takes the round over, the clusters (and their
  // backups) send their partial sums there.
  const std::string one = status.clusters(1).aggregator();
  const std::string backup_one = status.clusters(1).backups(0);
  const size_t one_opens = OpensAt(one).size();
  for (auto& [id, sink] : sinks) sink->events.clear();
  aggregator_.BreakWatches(kRoot, absl::UnavailableError("gone"));
  Step();
  status = Status("t");
  EXPECT_EQ(status.round(), 1u) << "the round goes on";
  EXPECT_EQ(status.aggregator(), backup);
  EXPECT_EQ(status.clusters(0).aggregator(), backup);
  EXPECT_EQ(status.clusters(0).backups_size(), 0) << "no aggregator left for a new backup";
  EXPECT_EQ(Metric("shoal_coordinator_failovers_total"), 1);
  at_backup = OpensAt(backup);
  ASSERT_EQ(at_backup.size(), 2u);
  EXPECT_TRUE(at_backup[1].standby_for().empty());
  EXPECT_TRUE(at_backup[1].parent().address().empty()) << "it is the root now";
  EXPECT_EQ(at_backup[1].round(), 1u);
  EXPECT_THAT(Ids(at_backup[1].expected_children()),
              ::testing::Not(::testing::Contains(backup_id)));
  ASSERT_EQ(OpensAt(one).size(), one_opens + 1);
  EXPECT_EQ(OpensAt(one).back().parent().address(), backup);
  EXPECT_EQ(OpensAt(one).back().parent().child(), "aggregator-1");
  EXPECT_EQ(OpensAt(backup_one).back().parent().address(), backup);
  EXPECT_EQ(OpensAt(backup_one).back().standby_for(), "aggregator-1");
  for (auto& [id, sink] : sinks) {
    for (const v1::CoordinatorEvent& e : sink->events) EXPECT_FALSE(e.has_task_assigned()) << id;
  }

  // The round closes at the clusters, then the new root; the next opens on the new root.
  aggregator_.contributors = {"a", "b", "c", "d"};
  for (const char* p : {"a", "b", "c", "d"}) Accept("t", 1, p);
  Step();
  ASSERT_EQ(aggregator_.close_addresses.size(), 3u);
  EXPECT_EQ(aggregator_.close_addresses[2], backup);
  EXPECT_EQ(Status("t").history_size(), 1);
}

}  // namespace
}  // namespace shoal::coordinator
