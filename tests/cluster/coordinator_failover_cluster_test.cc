// Coordinator fail-over with real processes: an etcd member, two coordinators on one key prefix
// and one checkpoint directory (the active one and its standby), an aggregator and three peers
// given both coordinator addresses, all over mutual TLS. The standby refuses calls naming the
// active one; the active one is SIGKILLed in the middle of a federated-sync task; the standby
// takes over within the hold's TTL (--store-lease=2s), the peers and the aggregator move on to
// it, and the task completes with every round exactly once. The same for a decentralized task
// (no aggregator). Prints the fail-over times.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::HasSubstr;

// An etcd member and two coordinators on one prefix and one state directory: the first one
// serves, the second one is its standby.
class CoordinatorFailoverClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-cluster-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    absl::StatusOr<std::unique_ptr<EtcdMember>> etcd = EtcdMember::Start(*dir);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    cluster_ = std::make_unique<Cluster>(*dir);
    ASSERT_TRUE(cluster_
                    ->StartCoordinator(
                        {"--store=etcd://" + etcd_->endpoint() + "/failover", "--store-lease=2s"})
                    .ok())
        << cluster_->LogTails();
    ASSERT_TRUE(cluster_->WaitForCoordinatorServing(absl::Seconds(20)).ok())
        << cluster_->LogTails();
    ASSERT_TRUE(cluster_->StartStandbyCoordinator().ok()) << cluster_->LogTails();
  }
  void TearDown() override {
    cluster_.reset();  // before etcd
    std::printf("test time: %s\n", absl::FormatDuration(absl::Now() - start_).c_str());
  }

  // Kills the active coordinator once `spec`'s round `round` is under way and waits for a round
  // to close at the standby; prints the times.
  void FailOverDuring(const common::v1::TaskSpec& spec, uint64_t round) {
    auto before = cluster_->WaitFor(
        spec.name(),
        [&](const cv1::TaskStatus& s) {
          return s.round() >= round && s.history_size() > 0 &&
                 s.history(s.history_size() - 1).round() + 1 == s.round();
        },
        absl::Minutes(2), absl::StrCat("round ", round));
    ASSERT_TRUE(before.ok()) << before.status();
    const uint64_t interrupted = before->round();
    const absl::Time killed = absl::Now();
    absl::StatusOr<absl::Duration> serving = cluster_->KillCoordinatorForStandby(absl::Seconds(20));
    ASSERT_TRUE(serving.ok()) << serving.status();
    // The next round event a client sees: the interrupted round closed by the new coordinator.
    auto next = cluster_->WaitFor(
        spec.name(),
        [&](const cv1::TaskStatus& s) {
          return s.history_size() > 0 && s.history(s.history_size() - 1).round() >= interrupted;
        },
        absl::Minutes(1), "the interrupted round at the standby");
    ASSERT_TRUE(next.ok()) << next.status();
    std::printf("fail-over (%s): kill -> the standby serving %s, kill -> round %llu closed %s\n",
                spec.name().c_str(), absl::FormatDuration(*serving).c_str(),
                static_cast<unsigned long long>(interrupted),
                absl::FormatDuration(absl::Now() - killed).c_str());
  }

  const absl::Time start_ = absl::Now();
  std::unique_ptr<EtcdMember> etcd_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(CoordinatorFailoverClusterTest, AStandbyTakesOverAKilledCoordinatorAndTheTaskCompletes) {
  Cluster& cluster = *cluster_;
  // The standby refuses every call, naming the active coordinator.
  {
    auto standby = cv1::ControlService::NewStub(
        rpc::MakeProbeChannel(cluster.standby().address, cluster.ClientCredentials()));
    absl::Status refused;
    WaitUntil(
        [&] {
          grpc::ClientContext context;
          rpc::SetTimeout(context, absl::Seconds(2));
          cv1::ListTasksResponse response;
          refused =
              rpc::FromGrpcStatus(standby->ListTasks(&context, cv1::ListTasksRequest(), &response));
          return absl::StrContains(refused.message(), cluster.coordinator().address);
        },
        Scaled(absl::Seconds(10)));
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("standby"));
    EXPECT_THAT(refused.message(), HasSubstr(cluster.coordinator().address));
  }

  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartPeer(i, 3).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("fails-over");
  spec.set_rounds(4);
  spec.set_min_participants(3);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  FailOverDuring(spec, 2);
  if (HasFatalFailure()) return;

  auto after = cluster.WaitForEnd(spec);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), cv1::TASK_STATE_COMPLETED) << after->ShortDebugString();
  ASSERT_EQ(after->history_size(), static_cast<int>(spec.rounds()));
  for (int i = 0; i < after->history_size(); ++i) {
    EXPECT_EQ(after->history(i).round(), static_cast<uint64_t>(i + 1));
    EXPECT_FALSE(after->history(i).participants().empty()) << "round " << i + 1;
  }
  // Everyone moved over: the peers' sessions and the aggregator are at the new coordinator.
  EXPECT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(20)).ok());
  absl::StatusOr<cv1::ListNodesResponse> nodes = cluster.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->aggregators_size(), 1) << nodes->ShortDebugString();
}

// A decentralized task (the peers exchange their updates themselves; no aggregator) fails over
// the same way.
TEST_F(CoordinatorFailoverClusterTest, ADecentralizedTaskFailsOverToo) {
  Cluster& cluster = *cluster_;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.StartPeer(i, 3).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("dec-fails-over");
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_rounds(3);
  spec.set_min_participants(3);
  spec.set_round_deadline_seconds(30);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  FailOverDuring(spec, 2);
  if (HasFatalFailure()) return;
  auto after = cluster.WaitForEnd(spec);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), cv1::TASK_STATE_COMPLETED) << after->ShortDebugString();
  ASSERT_EQ(after->history_size(), static_cast<int>(spec.rounds()));
  for (int i = 0; i < after->history_size(); ++i) {
    EXPECT_EQ(after->history(i).round(), static_cast<uint64_t>(i + 1));
  }
  EXPECT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace shoal::testing
