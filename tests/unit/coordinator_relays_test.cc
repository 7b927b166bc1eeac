// Relays for peers behind NAT (Hello.wants_relay): the coordinator picks a registered dedicated
// aggregator, tells the peer (Welcome.relay_address) and advertises it as RELAY/ID. And peers
// that accept a relay when they cannot be reached (Hello.relay_fallback): moved to one after a
// failed dial-back (RelayAssigned).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
using core_testing::FakeDialer;
using core_testing::FakeSink;
using ::testing::HasSubstr;

class CoordinatorRelaysTest : public CoordinatorCoreTest {
 protected:
  // Connects `name` asking for a relay: the relay it was given ("" when refused: `refused`).
  std::string JoinBehindNat(const std::string& name, absl::Status* refused = nullptr,
                            const std::string& lost = "") {
    auto sink = std::make_shared<FakeSink>();
    v1::Hello hello = core_testing::Hello(name);
    hello.set_wants_relay(true);
    hello.set_lost_relay(lost);
    hello.set_listen_address("127.0.0.1:1");  // ignored
    absl::StatusOr<std::string> id = core_->Connect(hello, /*identity=*/"", sink);
    if (!id.ok()) {
      if (refused != nullptr) *refused = id.status();
      return "";
    }
    sinks_[name] = sink;
    EXPECT_FALSE(sink->events.empty());
    if (sink->events.empty()) return "";
    EXPECT_TRUE(sink->events[0].has_welcome());
    return sink->events[0].welcome().relay_address();
  }
  std::string AddressOf(const std::string& peer) {
    const v1::ListNodesResponse nodes = core_->ListNodes();
    for (const v1::NodeInfo& node : nodes.peers()) {
      if (node.id() == peer) return node.address();
    }
    return "";
  }
  std::map<std::string, std::shared_ptr<FakeSink>> sinks_;
};

TEST_F(CoordinatorRelaysTest, APeerThatAsksForARelayGetsTheLeastLoadedDedicatedAggregator) {
  absl::Status refused;
  EXPECT_EQ(JoinBehindNat("peer-a", &refused), "");
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("no aggregator is registered to relay"));

  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5556").ok());
  const std::string a = JoinBehindNat("peer-a");
  const std::string b = JoinBehindNat("peer-b");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_NE(a, b) << "two relays, one peer each";
  EXPECT_EQ(AddressOf("peer-a"), a + "/peer-a");
  EXPECT_EQ(AddressOf("peer-b"), b + "/peer-b");

  // A reconnect keeps its relay; a peer that does not ask keeps its own address.
  EXPECT_EQ(JoinBehindNat("peer-a"), a);
  EXPECT_EQ(AddressOf("peer-a"), a + "/peer-a");
  Join("peer-c");
  EXPECT_EQ(AddressOf("peer-c"), "");

  // A peer that lost its relay gets the other one, even with more peers there; the lost one
  // again only when it is the only one.
  EXPECT_EQ(JoinBehindNat("peer-b", nullptr, b), a);
  EXPECT_EQ(AddressOf("peer-b"), a + "/peer-b");
  const std::string only = JoinBehindNat("peer-d", nullptr, "127.0.0.1:9999");
  EXPECT_TRUE(only == a || only == b) << only;
}

class CoordinatorRelayFallbackTest : public CoordinatorRelaysTest {
 protected:
  void SetUp() override {
    options_.dialer = &dialer_;
    options_.redial_interval = absl::Seconds(20);
    options_.aggregator_ttl = absl::Minutes(10);  // registered once, kept while time passes
    CoordinatorRelaysTest::SetUp();
  }
  // Connects `name`, listening at `address`, with Hello.relay_fallback set to `fallback`.
  std::shared_ptr<FakeSink> JoinAt(const std::string& name, const std::string& address,
                                   bool fallback) {
    auto sink = std::make_shared<FakeSink>();
    v1::Hello hello = core_testing::Hello(name);
    hello.set_listen_address(address);
    hello.set_relay_fallback(fallback);
    EXPECT_TRUE(core_->Connect(hello, /*identity=*/"", sink).ok());
    RunWork();  // the dial-backs (and the moves they cause)
    return sink;
  }
  common::v1::Reachability ReachabilityOf(const std::string& peer) {
    const v1::ListNodesResponse nodes = core_->ListNodes();
    for (const v1::NodeInfo& node : nodes.peers()) {
      if (node.id() == peer) return node.capacity().reachability();
    }
    return common::v1::REACHABILITY_UNKNOWN;
  }
  // Lets `d` pass in steps of a heartbeat interval, every connected peer sending heartbeats, and
  // runs the timers (and the dial-backs they start) after each step.
  void AliveFor(absl::Duration d) {
    for (absl::Duration passed; passed < d; passed += options_.heartbeat_interval) {
      clock_.Advance(options_.heartbeat_interval);
      const v1::ListNodesResponse nodes = core_->ListNodes();
      for (const v1::NodeInfo& node : nodes.peers()) {
        v1::PeerMessage beat;
        beat.mutable_heartbeat();
        EXPECT_TRUE(core_->OnMessage(node.id(), beat).ok());
      }
      Step();
    }
  }
  static std::vector<std::string> RelaysAssigned(const FakeSink& sink) {
    std::vector<std::string> relays;
    for (const v1::CoordinatorEvent& e : sink.events) {
      if (e.has_relay_assigned()) relays.push_back(e.relay_assigned().relay_address());
    }
    return relays;
  }
  FakeDialer dialer_;
};

TEST_F(CoordinatorRelayFallbackTest, AnUnreachablePeerThatAcceptsARelayIsMovedToOne) {
  dialer_.SetReachable({"127.0.0.1:5555", "127.0.0.1:5555/peer-a", "127.0.0.1:7001"});
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  RunWork();

  // Reachable: left where it is.
  std::shared_ptr<FakeSink> home = JoinAt("peer-home", "127.0.0.1:7001", /*fallback=*/true);
  EXPECT_EQ(AddressOf("peer-home"), "127.0.0.1:7001");
  EXPECT_EQ(ReachabilityOf("peer-home"), common::v1::REACHABILITY_REACHABLE);
  EXPECT_TRUE(RelaysAssigned(*home).empty());

  // Unreachable, accepts a relay: told which, advertised through it, and dialed there.
  std::shared_ptr<FakeSink> nat = JoinAt("peer-a", "10.9.9.9:7000", /*fallback=*/true);
  EXPECT_THAT(RelaysAssigned(*nat), ::testing::ElementsAre("127.0.0.1:5555"));
  EXPECT_EQ(AddressOf("peer-a"), "127.0.0.1:5555/peer-a");
  EXPECT_EQ(ReachabilityOf("peer-a"), common::v1::REACHABILITY_REACHABLE);
  EXPECT_THAT(dialer_.dialed(), ::testing::IsSupersetOf({std::string("10.9.9.9:7000"),
                                                         std::string("127.0.0.1:5555/peer-a")}));
  EXPECT_EQ(metrics_->peers_relayed.Value(), 1);

  // Its reconnects ask for the relay (as shoal-peer's do after RelayAssigned) and keep it.
  EXPECT_EQ(JoinBehindNat("peer-a"), "127.0.0.1:5555");
  EXPECT_EQ(AddressOf("peer-a"), "127.0.0.1:5555/peer-a");

  // Unreachable and declines relays (--relay=off): stays unreachable at its own address.
  std::shared_ptr<FakeSink> off = JoinAt("peer-off", "10.9.9.8:7000", /*fallback=*/false);
  EXPECT_TRUE(RelaysAssigned(*off).empty());
  EXPECT_EQ(AddressOf("peer-off"), "10.9.9.8:7000");
  EXPECT_EQ(ReachabilityOf("peer-off"), common::v1::REACHABILITY_UNREACHABLE);
  EXPECT_EQ(metrics_->peers_relayed.Value(), 1);
}

TEST_F(CoordinatorRelayFallbackTest, WithoutAnAggregatorToRelayThePeerStaysUnreachable) {
  std::shared_ptr<FakeSink> nat = JoinAt("peer-a", "10.9.9.9:7000", /*fallback=*/true);
  EXPECT_TRUE(RelaysAssigned(*nat).empty());
  EXPECT_EQ(AddressOf("peer-a"), "10.9.9.9:7000");
  EXPECT_EQ(ReachabilityOf("peer-a"), common::v1::REACHABILITY_UNREACHABLE);

  // A peer moved to a relay earlier reconnects (wants_relay and relay_fallback) when none is
  // registered: taken at its own address, without a relay, rather than refused.
  auto sink = std::make_shared<FakeSink>();
  v1::Hello hello = core_testing::Hello("peer-b");
  hello.set_listen_address("10.9.9.8:7000");
  hello.set_wants_relay(true);
  hello.set_relay_fallback(true);
  ASSERT_TRUE(core_->Connect(hello, /*identity=*/"", sink).ok());
  RunWork();
  ASSERT_FALSE(sink->events.empty());
  EXPECT_EQ(sink->events[0].welcome().relay_address(), "");
  EXPECT_EQ(AddressOf("peer-b"), "10.9.9.8:7000");
  EXPECT_EQ(ReachabilityOf("peer-b"), common::v1::REACHABILITY_UNREACHABLE);

  // An aggregator registers: the next reconnect is relayed again.
  dialer_.SetReachable({"127.0.0.1:5555", "127.0.0.1:5555/peer-b"});
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  auto again = std::make_shared<FakeSink>();
  ASSERT_TRUE(core_->Connect(hello, /*identity=*/"", again).ok());
  RunWork();
  EXPECT_EQ(again->events[0].welcome().relay_address(), "127.0.0.1:5555");
  EXPECT_EQ(AddressOf("peer-b"), "127.0.0.1:5555/peer-b");
  EXPECT_EQ(ReachabilityOf("peer-b"), common::v1::REACHABILITY_REACHABLE);
}

// Peers are dialed again every redial_interval: one that stops answering later in its session is
// moved to a relay then, and so is one that no aggregator could relay for when it connected.
TEST_F(CoordinatorRelayFallbackTest, APeerIsDialedAgainAndMovedWhenItStopsAnswering) {
  dialer_.SetReachable({"127.0.0.1:7001"});
  std::shared_ptr<FakeSink> home = JoinAt("peer-home", "127.0.0.1:7001", /*fallback=*/true);
  std::shared_ptr<FakeSink> nat = JoinAt("peer-nat", "10.9.9.9:7000", /*fallback=*/true);
  EXPECT_EQ(ReachabilityOf("peer-home"), common::v1::REACHABILITY_REACHABLE);
  EXPECT_EQ(ReachabilityOf("peer-nat"), common::v1::REACHABILITY_UNREACHABLE);
  const size_t dials = dialer_.dialed().size();

  // Within the interval nobody is dialed again.
  const absl::Duration interval = options_.redial_interval;
  AliveFor(interval / 2);
  EXPECT_EQ(dialer_.dialed().size(), dials);

  // An aggregator registers and peer-home's address stops answering (its NAT mapping changed):
  // at the next dial-backs both are moved to it.
  dialer_.SetReachable({"127.0.0.1:5555", "127.0.0.1:5555/peer-home", "127.0.0.1:5555/peer-nat"});
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  RunWork();
  AliveFor(interval / 2);
  EXPECT_THAT(RelaysAssigned(*home), ::testing::ElementsAre("127.0.0.1:5555"));
  EXPECT_THAT(RelaysAssigned(*nat), ::testing::ElementsAre("127.0.0.1:5555"));
  EXPECT_EQ(AddressOf("peer-home"), "127.0.0.1:5555/peer-home");
  EXPECT_EQ(AddressOf("peer-nat"), "127.0.0.1:5555/peer-nat");
  EXPECT_EQ(ReachabilityOf("peer-home"), common::v1::REACHABILITY_REACHABLE);
  EXPECT_EQ(metrics_->peers_relayed.Value(), 2);

  // A relayed peer's relay stops answering: dialed there, marked unreachable, not moved again
  // (it reconnects with Hello.lost_relay when its relay stream breaks).
  dialer_.SetReachable({"127.0.0.1:5555", "127.0.0.1:5555/peer-nat"});
  AliveFor(interval);
  EXPECT_EQ(ReachabilityOf("peer-home"), common::v1::REACHABILITY_UNREACHABLE);
  EXPECT_EQ(ReachabilityOf("peer-nat"), common::v1::REACHABILITY_REACHABLE);
  EXPECT_EQ(RelaysAssigned(*home).size(), 1u);
}

// A relayed peer found unreachable (its relay stream late, or its relay gone) is dialed again
// after 5 s, then 10, then every redial_interval (20 s here), and is reachable at the first
// dial-back its relay answers; then it is dialed every interval again.
TEST_F(CoordinatorRelayFallbackTest, ARelayedPeerFoundUnreachableIsDialedAgainSooner) {
  dialer_.SetReachable({"127.0.0.1:5555"});
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  RunWork();
  ASSERT_EQ(JoinBehindNat("peer-a"), "127.0.0.1:5555");
  RunWork();
  EXPECT_EQ(ReachabilityOf("peer-a"), common::v1::REACHABILITY_UNREACHABLE);
  auto dials = [&] {
    const std::vector<std::string> dialed = dialer_.dialed();
    return std::count(dialed.begin(), dialed.end(), "127.0.0.1:5555/peer-a");
  };
  EXPECT_EQ(dials(), 1);
  // Steps of 2 s (the heartbeat interval): the dial-backs at 6 s, 16 s, 36 s and 56 s.
  const std::vector<std::pair<absl::Duration, int>> expected = {
      {absl::Seconds(4), 1},  {absl::Seconds(2), 2}, {absl::Seconds(8), 2},  {absl::Seconds(2), 3},
      {absl::Seconds(18), 3}, {absl::Seconds(2), 4}, {absl::Seconds(18), 4}, {absl::Seconds(2), 5}};
  absl::Duration at;
  for (const auto& [wait, count] : expected) {
    AliveFor(wait);
    at += wait;
    EXPECT_EQ(dials(), count) << "at " << at;
  }
  EXPECT_EQ(ReachabilityOf("peer-a"), common::v1::REACHABILITY_UNREACHABLE);

  // Its relay answers: reachable at the next dial-back (76 s), then dialed every 20 s.
  dialer_.SetReachable({"127.0.0.1:5555", "127.0.0.1:5555/peer-a"});
  AliveFor(absl::Seconds(20));
  EXPECT_EQ(dials(), 6);
  EXPECT_EQ(ReachabilityOf("peer-a"), common::v1::REACHABILITY_REACHABLE);
  AliveFor(absl::Seconds(18));
  EXPECT_EQ(dials(), 6);
  AliveFor(absl::Seconds(2));
  EXPECT_EQ(dials(), 7);
}

TEST_F(CoordinatorRelayFallbackTest, APeerMovedDuringItsTaskIsKnownToTheModeByItsNewAddress) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  dialer_.SetReachable(
      {"127.0.0.1:5555", "127.0.0.1:5555/peer-2", "127.0.0.1:7000", "127.0.0.1:7001"});
  common::v1::TaskSpec spec = core_testing::Spec("dec", /*min=*/3, /*rounds=*/5);
  spec.set_mode(common::v1::MODE_GOSSIP);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  std::vector<std::shared_ptr<FakeSink>> sinks;
  sinks.push_back(JoinAt("peer-0", "127.0.0.1:7000", true));
  sinks.push_back(JoinAt("peer-1", "127.0.0.1:7001", true));
  // The dial-back of peer-2 is held until all three are in the task.
  auto sink = std::make_shared<FakeSink>();
  v1::Hello hello = core_testing::Hello("peer-2");
  hello.set_listen_address("10.9.9.9:7000");
  hello.set_relay_fallback(true);
  ASSERT_TRUE(core_->Connect(hello, /*identity=*/"", sink).ok());
  sinks.push_back(sink);
  Step();
  // The others' latest member list names peer-2 at its relay.
  std::string seen;
  for (const v1::CoordinatorEvent& e : sinks[0]->events) {
    if (!e.has_gossip_members()) continue;
    for (const auto& member : e.gossip_members().peers()) {
      if (member.peer_id() == "peer-2") seen = member.address();
    }
  }
  EXPECT_EQ(seen, "127.0.0.1:5555/peer-2");
  EXPECT_THAT(RelaysAssigned(*sink), ::testing::ElementsAre("127.0.0.1:5555"));
}

}  // namespace
}  // namespace shoal::coordinator
