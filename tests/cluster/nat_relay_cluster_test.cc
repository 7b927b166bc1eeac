// Peers behind NAT, with real processes in network namespaces this test makes itself (it must
// run as root; without the permission it is skipped, saying so). Namespace "lan" holds the
// coordinator, an aggregator (the relay) and two peers, all on 10.77.0.1, and this test process
// itself; namespace "nat" holds one peer that listens only on its own namespace's loopback, so
// nothing can connect to it, and that reaches "lan" through a veth pair (10.77.0.2 -> 10.77.0.1).
// Relayed (the coordinator moves it to a relay when it cannot dial it back, or it asks for one
// with --relay), it keeps a stream open to the aggregator and trains with the others in
// decentralized and in gossip mode. The host's own network is not touched.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/http_get.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::Contains;

constexpr char kLanAddress[] = "10.77.0.1";

// The two namespaces and their veth pair, made once per test binary (gRPC's threads, once
// started, stay in the namespace they started in); this process enters "lan" for good.
class Namespaces {
 public:
  static Namespaces& Get() {
    static Namespaces* namespaces = new Namespaces();
    return *namespaces;
  }
  // Empty when they are up; else why not.
  const std::string& error() const { return error_; }
  std::string nat() const { return nat_; }

 private:
  Namespaces()
      : lan_(absl::StrCat("shoal-lan-", getpid())), nat_(absl::StrCat("shoal-nat-", getpid())) {
    if (geteuid() != 0) {
      error_ = "network namespaces need root (ip netns)";
      return;
    }
    std::atexit([] { Get().Remove(); });
    const std::vector<std::string> steps = {
        absl::StrCat("ip netns add ", lan_),
        absl::StrCat("ip netns add ", nat_),
        absl::StrCat("ip -n ", lan_, " link set lo up"),
        absl::StrCat("ip -n ", nat_, " link set lo up"),
        absl::StrCat("ip -n ", lan_, " link add shoal-lan type veth peer name shoal-nat netns ",
                     nat_),
        absl::StrCat("ip -n ", lan_, " addr add ", kLanAddress, "/24 dev shoal-lan"),
        absl::StrCat("ip -n ", lan_, " link set shoal-lan up"),
        absl::StrCat("ip -n ", nat_, " addr add 10.77.0.2/24 dev shoal-nat"),
        absl::StrCat("ip -n ", nat_, " link set shoal-nat up"),
    };
    for (const std::string& step : steps) {
      if (std::system((step + " 2>/dev/null").c_str()) != 0) {
        error_ = absl::StrCat("network namespaces are not permitted here (`", step, "` failed)");
        return;
      }
    }
    const std::string path = "/var/run/netns/" + lan_;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      error_ = absl::StrCat("cannot enter ", path);
    }
    if (fd >= 0) close(fd);
  }
  void Remove() {
    std::system(absl::StrCat("ip netns del ", nat_, " 2>/dev/null").c_str());
    std::system(absl::StrCat("ip netns del ", lan_, " 2>/dev/null").c_str());
  }

  const std::string lan_;
  const std::string nat_;
  std::string error_;
};

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-nat-cluster-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

// peer-2 as the coordinator lists it once its dial-back has answered (and, when given, once
// it is advertised at `address`).
absl::StatusOr<cv1::NodeInfo> DialedNode(Cluster& cluster, const std::string& address = "") {
  absl::StatusOr<cv1::NodeInfo> found = absl::NotFoundError("peer-2 is not listed");
  WaitUntil(
      [&] {
        absl::StatusOr<cv1::ListNodesResponse> nodes = cluster.Nodes();
        if (!nodes.ok()) return false;
        for (const cv1::NodeInfo& node : nodes->peers()) {
          if (node.id() == "peer-2") found = node;
        }
        return found.ok() && found->capacity().reachability() != common::v1::REACHABILITY_UNKNOWN &&
               (address.empty() || found->address() == address);
      },
      absl::Seconds(60));
  return found;
}

// How peer-2 comes to be relayed: moved by the coordinator (the default flags), or naming the
// aggregator itself (--relay=ADDRESS).
enum class Relay { kMovedByTheCoordinator, kNamedByThePeer };

// Coordinator, aggregator, peer-0 and peer-1 in "lan"; peer-2 in "nat", relayed by the
// aggregator. Checks that the coordinator sees peer-2 at RELAY/peer-2 and reaches it there.
void StartCluster(Cluster& cluster, Relay relay) {
  cluster.set_host(kLanAddress);
  absl::Status s = cluster.StartCoordinator();
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  s = cluster.StartAggregator();
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  s = cluster.StartPeers(0, 2, 3);
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  std::vector<std::string> flags;
  if (relay == Relay::kNamedByThePeer) flags.push_back("--relay=" + cluster.aggregator().address);
  s = cluster.StartPeerInNetns(2, 3, Namespaces::Get().nat(), flags);
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();

  absl::StatusOr<cv1::NodeInfo> node =
      DialedNode(cluster, cluster.aggregator().address + "/peer-2");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->address(), cluster.aggregator().address + "/peer-2");
  EXPECT_EQ(node->capacity().reachability(), common::v1::REACHABILITY_REACHABLE)
      << node->ShortDebugString();
}

// shoal_aggregator_relay_calls_total{result="relayed"} and _relay_bytes_total at the relay.
std::pair<double, double> RelayFigures(Cluster& cluster) {
  absl::StatusOr<std::string> page = HttpGet(cluster.aggregator().metrics_address, "/metrics");
  EXPECT_TRUE(page.ok()) << page.status();
  if (!page.ok()) return {-1, -1};
  return {MetricValue(*page, "shoal_aggregator_relay_calls_total{result=\"relayed\"}"),
          MetricValue(*page, "shoal_aggregator_relay_bytes_total")};
}

bool Completed(const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; }

// The premise: without a relay, nothing reaches the peer in "nat" (it advertises the address it
// listens on, its own namespace's loopback). With --relay=off it is not moved to the relay
// either.
TEST(NatRelayClusterTest, APeerThatDeclinesRelaysIsUnreachable) {
  if (!Namespaces::Get().error().empty()) GTEST_SKIP() << Namespaces::Get().error();
  Cluster cluster(TempDir());
  cluster.set_host(kLanAddress);
  absl::Status s = cluster.StartCoordinator();
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  s = cluster.StartAggregator();
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  s = cluster.StartPeerInNetns(2, 3, Namespaces::Get().nat(), {"--relay=off"});
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(1, absl::Seconds(60)).ok()) << cluster.LogTails();
  absl::StatusOr<cv1::NodeInfo> node = DialedNode(cluster);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->capacity().reachability(), common::v1::REACHABILITY_UNREACHABLE)
      << node->ShortDebugString();
  EXPECT_NE(node->address(), cluster.aggregator().address + "/peer-2");
}

// peer-2 runs with the default flags: the coordinator cannot dial it back, so it moves it to
// the relay (RelayAssigned).
TEST(NatRelayClusterTest, AnUnreachablePeerIsMovedToARelayAndTakesPartInEveryRound) {
  if (!Namespaces::Get().error().empty()) GTEST_SKIP() << Namespaces::Get().error();
  Cluster cluster(TempDir());
  StartCluster(cluster, Relay::kMovedByTheCoordinator);
  if (HasFatalFailure()) return;
  absl::StatusOr<std::string> page = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(MetricValue(*page, "shoal_coordinator_peers_relayed_total"), 1);

  common::v1::TaskSpec spec = SmallTask("nat-decentralized");
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_rounds(3);
  spec.set_round_batches(40);
  spec.set_min_participants(3);
  spec.set_round_deadline_seconds(30);
  spec.set_max_connection_retry(2);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitFor(spec.name(), Completed, Cluster::TaskBound(spec), "completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), 3);
  for (const cv1::RoundSummary& round : status->history()) {
    SCOPED_TRACE(round.ShortDebugString());
    // Each participant fetched the others' updates: peer-2's through the relay.
    EXPECT_THAT(round.participants(), Contains("peer-2"));
    EXPECT_EQ(round.participants_size(), 3);
    EXPECT_TRUE(round.removed().empty());
  }
  const auto [calls, bytes] = RelayFigures(cluster);
  std::cout << "relayed for peer-2: " << calls << " calls, " << bytes << " bytes\n";
  // Per round: two probes and two updates for peer-2, at the least.
  EXPECT_GE(calls, 3 * 4) << cluster.LogTails();
  EXPECT_GT(bytes, 0);
}

// peer-2 names its relay (--relay=ADDRESS).
TEST(NatRelayClusterTest, ARelayedPeerGossipsWithTheOthers) {
  if (!Namespaces::Get().error().empty()) GTEST_SKIP() << Namespaces::Get().error();
  Cluster cluster(TempDir());
  StartCluster(cluster, Relay::kNamedByThePeer);
  if (HasFatalFailure()) return;

  common::v1::TaskSpec spec = SmallTask("nat-gossip");
  spec.set_mode(common::v1::MODE_GOSSIP);
  spec.set_min_participants(3);
  spec.set_round_batches(10);
  spec.set_rounds(20);
  spec.mutable_gossip()->set_fetch_probability(1);
  spec.mutable_gossip()->set_timeout_ms(2000);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitFor(spec.name(), Completed, Cluster::TaskBound(spec), "completion");
  ASSERT_TRUE(status.ok()) << status.status();
  const auto [calls, bytes] = RelayFigures(cluster);
  std::cout << "relayed for peer-2: " << calls << " calls, " << bytes << " bytes\n";
  // The other two fetch peer-2's parameters through the relay.
  EXPECT_GT(calls, 0) << cluster.LogTails();
  EXPECT_GT(bytes, 0);
}

// peer-2's relay (picked by the coordinator) is SIGKILLed: after 10 s without a stream the peer
// opens a new session naming it lost, and is given the other aggregator.
TEST(NatRelayClusterTest, APeerWhoseRelayDiesIsGivenAnother) {
  if (!Namespaces::Get().error().empty()) GTEST_SKIP() << Namespaces::Get().error();
  Cluster cluster(TempDir());
  cluster.set_host(kLanAddress);
  absl::Status s = cluster.StartCoordinator();
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  for (int i = 0; i < 2; ++i) {
    s = cluster.StartAggregator();
    ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<cv1::ListNodesResponse> nodes = cluster.Nodes();
        return nodes.ok() && nodes->aggregators_size() == 2;
      },
      absl::Seconds(30)))
      << cluster.LogTails();
  s = cluster.StartPeerInNetns(2, 3, Namespaces::Get().nat(), {"--relay=auto"});
  ASSERT_TRUE(s.ok()) << s << "\n" << cluster.LogTails();
  absl::StatusOr<cv1::NodeInfo> node = DialedNode(cluster);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_EQ(node->capacity().reachability(), common::v1::REACHABILITY_REACHABLE)
      << node->ShortDebugString();
  const int first = node->address() == cluster.aggregator(0).address + "/peer-2" ? 0 : 1;
  ASSERT_EQ(node->address(), cluster.aggregator(first).address + "/peer-2");

  const absl::Time killed = absl::Now();
  cluster.aggregator(first).process->Signal(SIGKILL);
  const std::string next = cluster.aggregator(1 - first).address + "/peer-2";
  node = DialedNode(cluster, next);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->address(), next) << cluster.LogTails();
  EXPECT_EQ(node->capacity().reachability(), common::v1::REACHABILITY_REACHABLE)
      << node->ShortDebugString();
  std::cout << "relayed by the other aggregator " << absl::Now() - killed << " after the kill\n";
}

}  // namespace
}  // namespace shoal::testing
