// The nodes the coordinator knows, with their capacity: what peers and aggregators report, and
// the reachability the coordinator finds by dialing them back (a fake dialer here; the real one
// is tested in tests/service/coordinator_capacity_test.cc).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
using core_testing::FakeDialer;
using core_testing::FakeSink;
using core_testing::Hello;
using core_testing::Spec;

common::v1::Capacity SomeCapacity(uint32_t cores) {
  common::v1::Capacity c;
  c.set_cpu_cores(cores);
  c.set_matmul_gflops(12.5);
  c.set_memory_bytes(uint64_t{8} << 30);
  c.set_memory_available_bytes(uint64_t{6} << 30);
  c.set_upload_bytes_per_second(1.25e8);
  c.set_upload_probe_bytes(4 << 20);
  // A node cannot claim to be reachable: the coordinator finds out itself.
  c.set_reachability(common::v1::REACHABILITY_REACHABLE);
  return c;
}

v1::Hello HelloFrom(const std::string& name, const std::string& address, uint32_t cores) {
  v1::Hello hello = Hello(name);
  hello.set_listen_address(address);
  *hello.mutable_capacity() = SomeCapacity(cores);
  return hello;
}

class CoordinatorNodesTest : public CoordinatorCoreTest {
 protected:
  void SetUp() override {
    options_.dialer = &dialer_;
    CoordinatorCoreTest::SetUp();
  }
  FakeDialer dialer_;
};

TEST_F(CoordinatorNodesTest, PeersAndAggregatorsAreListedWithTheirCapacityAndReachability) {
  dialer_.SetReachable({"127.0.0.1:9001", "127.0.0.1:7100"});
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7100", SomeCapacity(16)).ok());
  auto a = std::make_shared<FakeSink>();
  auto b = std::make_shared<FakeSink>();
  ASSERT_TRUE(core_->Connect(HelloFrom("a", "127.0.0.1:9001", 4), "", a).ok());
  ASSERT_TRUE(core_->Connect(HelloFrom("b", "10.0.0.2:9002", 2), "", b).ok());

  // Before the dials ran the reachability is unknown, whatever the nodes claimed.
  v1::ListNodesResponse nodes = core_->ListNodes();
  ASSERT_EQ(nodes.peers_size(), 2);
  ASSERT_EQ(nodes.aggregators_size(), 1);
  EXPECT_EQ(nodes.peers(0).capacity().reachability(), common::v1::REACHABILITY_UNKNOWN);
  EXPECT_EQ(nodes.aggregators(0).capacity().reachability(), common::v1::REACHABILITY_UNKNOWN);

  RunWork();  // the dials
  nodes = core_->ListNodes();
  const v1::NodeInfo& pa = nodes.peers(0);
  EXPECT_EQ(pa.id(), "a");
  EXPECT_EQ(pa.role(), "peer");
  EXPECT_EQ(pa.address(), "127.0.0.1:9001");
  EXPECT_EQ(pa.device(), "cpu");
  EXPECT_EQ(pa.capacity().cpu_cores(), 4u);
  EXPECT_DOUBLE_EQ(pa.capacity().matmul_gflops(), 12.5);
  EXPECT_DOUBLE_EQ(pa.capacity().upload_bytes_per_second(), 1.25e8);
  EXPECT_EQ(pa.capacity().reachability(), common::v1::REACHABILITY_REACHABLE);
  EXPECT_EQ(nodes.peers(1).id(), "b");
  EXPECT_EQ(nodes.peers(1).capacity().reachability(), common::v1::REACHABILITY_UNREACHABLE);
  const v1::NodeInfo& agg = nodes.aggregators(0);
  EXPECT_EQ(agg.id(), "127.0.0.1:7100");
  EXPECT_EQ(agg.role(), "aggregator");
  EXPECT_EQ(agg.capacity().cpu_cores(), 16u);
  EXPECT_EQ(agg.capacity().reachability(), common::v1::REACHABILITY_REACHABLE);

  // A registration heartbeat is not dialed again and keeps the reachability found.
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7100", SomeCapacity(16)).ok());
  RunWork();
  EXPECT_EQ(core_->ListNodes().aggregators(0).capacity().reachability(),
            common::v1::REACHABILITY_REACHABLE);
  EXPECT_THAT(dialer_.dialed(),
              ::testing::UnorderedElementsAre("127.0.0.1:7100", "127.0.0.1:9001", "10.0.0.2:9002"));

  // A peer that leaves is no longer listed.
  core_->Disconnect("b", b.get());
  nodes = core_->ListNodes();
  ASSERT_EQ(nodes.peers_size(), 1);
  EXPECT_EQ(nodes.peers(0).id(), "a");
}

TEST_F(CoordinatorNodesTest, TheDialOfAReplacedSessionDoesNotCount) {
  dialer_.SetReachable({"127.0.0.1:9001"});
  auto first = std::make_shared<FakeSink>();
  auto second = std::make_shared<FakeSink>();
  ASSERT_TRUE(core_->Connect(HelloFrom("a", "127.0.0.1:9001", 4), "", first).ok());
  // It reconnects from another address before the first dial answered.
  ASSERT_TRUE(core_->Connect(HelloFrom("a", "127.0.0.1:9009", 4), "", second).ok());
  RunWork();
  EXPECT_EQ(dialer_.dialed().size(), 2u);
  EXPECT_EQ(core_->ListNodes().peers(0).capacity().reachability(),
            common::v1::REACHABILITY_UNREACHABLE);
}

TEST_F(CoordinatorNodesTest, ATaskStatusShowsItsParticipantsAndItsAggregator) {
  auto sinks = StartTask(Spec("t", 2, 5), {"a", "b"});
  v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.nodes_size(), 3);
  EXPECT_EQ(status.nodes(0).id(), "a");
  EXPECT_EQ(status.nodes(0).task(), "t");
  EXPECT_EQ(status.nodes(1).id(), "b");
  EXPECT_EQ(status.nodes(2).id(), "127.0.0.1:5555");
  EXPECT_EQ(status.nodes(2).role(), "aggregator");
  // Peers without an address are not dialed; their reachability stays unknown.
  EXPECT_EQ(status.nodes(0).capacity().reachability(), common::v1::REACHABILITY_UNKNOWN);
}

TEST_F(CoordinatorNodesTest, ATaskGetsTheMostCapableReachableAggregatorAmongTheLeastLoaded) {
  dialer_.SetReachable({"127.0.0.1:7100", "127.0.0.1:7200"});  // 7300 cannot be dialed
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7100", SomeCapacity(2)).ok());
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7200", SomeCapacity(8)).ok());
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7300", SomeCapacity(64)).ok());
  RunWork();  // the dials
  ASSERT_TRUE(core_->CreateTask(Spec("t1", 1, 5)).ok());
  EXPECT_EQ(Status("t1").aggregator(), "127.0.0.1:7200");  // the most compute, reachable
  ASSERT_TRUE(core_->CreateTask(Spec("t2", 1, 5)).ok());
  EXPECT_EQ(Status("t2").aggregator(), "127.0.0.1:7100");  // fewer tasks first
  ASSERT_TRUE(core_->CreateTask(Spec("t3", 1, 5)).ok());
  EXPECT_EQ(Status("t3").aggregator(), "127.0.0.1:7200");
}

}  // namespace
}  // namespace shoal::coordinator
