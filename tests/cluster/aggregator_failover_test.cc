// Losing an aggregator never fails a task: real processes on 127.0.0.1 (a coordinator, two
// aggregators, three peers, mutual TLS); the aggregator the task uses is SIGKILLed mid-task and
// the task completes on the other one from its newest checkpoint.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-failover-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

class AggregatorFailoverTest : public ::testing::TestWithParam<common::v1::Mode> {};

TEST_P(AggregatorFailoverTest, KilledAggregatorMovesTheTaskWhichCompletes) {
  Cluster cluster(TempDir());
  cluster.set_batch_floor_ms(50);  // rounds of at least 1 s: the aggregator dies mid-task
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  for (int i = 0; i < 2; ++i) {
    absl::Status started = cluster.StartAggregator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  {
    absl::Status started = cluster.StartPeers(0, 3, 3);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(30)).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("survives-its-aggregator");
  spec.set_mode(GetParam());
  spec.set_rounds(5);
  if (GetParam() == common::v1::MODE_FEDERATED_ASYNC) spec.mutable_async()->set_buffer_size(2);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // Once two rounds (versions) are done, kill the aggregator the task uses, with its newest
  // version checkpointed: the peers are paused first, so that no version comes after the one
  // whose checkpoint is read back (the status shows a version before its checkpoint is written;
  // a version held by the killed aggregator alone would be lost, and the task would go back).
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.history_size() >= 2 && s.state() == cv1::TASK_STATE_RUNNING;
      },
      absl::Minutes(3), "two rounds done");
  ASSERT_TRUE(status.ok()) << status.status();
  for (int i = 0; i < 3; ++i) cluster.peer(i).process->Signal(SIGSTOP);
  const auto checkpointed = [&](uint64_t version) {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(5));
    cv1::GetModelRequest request;
    request.set_name(spec.name());
    request.set_version(version);
    auto reader = cluster.control().GetModel(&context, request);
    return rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &context).ok();
  };
  EXPECT_TRUE(WaitUntil(
      [&] {
        status = cluster.Status(spec.name());
        return status.ok() && checkpointed(status->model_version()) &&
               cluster.Status(spec.name()).value_or(cv1::TaskStatus()).model_version() ==
                   status->model_version();
      },
      absl::Seconds(30)))
      << "the newest version's checkpoint";
  ASSERT_TRUE(status.ok()) << status.status();
  const std::string doomed = status->aggregator();
  int killed = -1;
  for (int i = 0; i < cluster.aggregator_count(); ++i) {
    if (cluster.aggregator(i).address == doomed) killed = i;
  }
  ASSERT_GE(killed, 0) << "the task's aggregator " << doomed << " is not one of ours";
  const absl::Time kill_time = absl::Now();
  cluster.aggregator(killed).process->Signal(SIGKILL);
  for (int i = 0; i < 3; ++i) cluster.peer(i).process->Signal(SIGCONT);

  status = cluster.WaitFor(
      spec.name(),
      [&](const cv1::TaskStatus& s) { return !s.aggregator().empty() && s.aggregator() != doomed; },
      absl::Seconds(30), "the task on the other aggregator");
  ASSERT_TRUE(status.ok()) << status.status();
  const absl::Duration moved_after = absl::Now() - kill_time;
  std::printf("[ figure ] %s task moved to the other aggregator %.2f s after the SIGKILL\n",
              GetParam() == common::v1::MODE_FEDERATED_ASYNC ? "federated-async" : "federated-sync",
              absl::ToDoubleSeconds(moved_after));

  status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.state() != cv1::TASK_STATE_RUNNING && s.state() != cv1::TASK_STATE_WAITING;
      },
      absl::Minutes(5), "the end of the task");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << "\n"
                                                        << cluster.LogTails();
  EXPECT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  EXPECT_EQ(status->model_version(), spec.rounds());
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_TRUE(last.evaluated()) << last.ShortDebugString();
  EXPECT_GT(last.test_accuracy(), 0.5) << "far above chance (0.1): the training went on";
}

INSTANTIATE_TEST_SUITE_P(Modes, AggregatorFailoverTest,
                         ::testing::Values(common::v1::MODE_FEDERATED_SYNC,
                                           common::v1::MODE_FEDERATED_ASYNC),
                         [](const ::testing::TestParamInfo<common::v1::Mode>& info) {
                           return info.param == common::v1::MODE_FEDERATED_ASYNC ? "Async" : "Sync";
                         });

}  // namespace
}  // namespace shoal::testing
