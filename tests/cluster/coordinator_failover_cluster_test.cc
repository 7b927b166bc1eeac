// Coordinator fail-over with real processes: an etcd member, two coordinators on one key prefix
// and one checkpoint directory (the active one and its standby), an aggregator and three peers
// given both coordinator addresses, all over mutual TLS. The standby refuses calls naming the
// active one; the active one is SIGKILLed in the middle of a federated-sync task; the standby
// takes over within the hold's TTL (--store-lease=2s), the peers and the aggregator move on to
// it, and the task completes with every round exactly once. Prints the fail-over times.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

TEST(CoordinatorFailoverClusterTest, AStandbyTakesOverAKilledCoordinatorAndTheTaskCompletes) {
  const absl::Time test_start = absl::Now();
  absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-cluster-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<EtcdMember>> etcd = EtcdMember::Start(*dir);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster
                  .StartCoordinator(
                      {"--store=etcd://" + (*etcd)->endpoint() + "/failover", "--store-lease=2s"})
                  .ok())
      << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForCoordinatorServing(absl::Seconds(20)).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartStandbyCoordinator().ok()) << cluster.LogTails();

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
  spec.set_rounds(5);
  spec.set_min_participants(3);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto before = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.round() >= 2 && s.phase() == cv1::ROUND_PHASE_TRAINING;
      },
      absl::Minutes(2), "round 2");
  ASSERT_TRUE(before.ok()) << before.status();
  const uint64_t interrupted = before->round();

  const absl::Time killed = absl::Now();
  absl::StatusOr<absl::Duration> serving = cluster.KillCoordinatorForStandby(absl::Seconds(20));
  ASSERT_TRUE(serving.ok()) << serving.status();
  // The next round event a client sees: the interrupted round closed by the new coordinator.
  auto next = cluster.WaitFor(
      spec.name(),
      [&](const cv1::TaskStatus& s) {
        return s.history_size() > 0 && s.history(s.history_size() - 1).round() >= interrupted;
      },
      absl::Minutes(1), "the interrupted round at the standby");
  ASSERT_TRUE(next.ok()) << next.status();
  const absl::Duration next_round = absl::Now() - killed;
  std::printf("fail-over: kill -> the standby serving %s, kill -> round %llu closed %s\n",
              absl::FormatDuration(*serving).c_str(), static_cast<unsigned long long>(interrupted),
              absl::FormatDuration(next_round).c_str());

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
  std::printf("test time: %s\n", absl::FormatDuration(absl::Now() - test_start).c_str());
}

}  // namespace
}  // namespace shoal::testing
