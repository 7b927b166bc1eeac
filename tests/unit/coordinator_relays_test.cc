// Relays for peers behind NAT (Hello.wants_relay): the coordinator picks a registered dedicated
// aggregator, tells the peer (Welcome.relay_address) and advertises it as RELAY/ID.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
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

}  // namespace
}  // namespace shoal::coordinator
