// The coordinator on etcd (`--store etcd://...`), with real processes: an etcd member, a
// coordinator, an aggregator and two peers over mutual TLS. The coordinator is SIGKILLed in the
// middle of a task and started again on the same address: the task resumes from etcd's records
// and its newest checkpoint file and completes with every round once. The state directory holds
// the checkpoint files only, and etcd a record of every round. Then two coordinators on one
// prefix: the one that lost its hold steps down.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "libs/etcd/etcd_kv.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;

TEST(CoordinatorEtcdClusterTest, ACoordinatorKilledMidTaskResumesFromEtcd) {
  absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-cluster-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<EtcdMember>> etcd = EtcdMember::Start(*dir);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  Cluster cluster(*dir);
  const std::string prefix = "/cluster-test";
  ASSERT_TRUE(cluster.StartCoordinator({"--store=etcd://" + (*etcd)->endpoint() + prefix}).ok())
      << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeer(0, 2).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeer(1, 2).ok()) << cluster.LogTails();
  common::v1::TaskSpec spec = SmallTask("on-etcd");
  spec.set_rounds(4);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto before = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.round() >= 2 && s.phase() == cv1::ROUND_PHASE_TRAINING;
      },
      absl::Minutes(3), "round 2");
  ASSERT_TRUE(before.ok()) << before.status();

  absl::Status restarted = cluster.RestartCoordinator(/*crash=*/true);
  ASSERT_TRUE(restarted.ok()) << restarted << cluster.LogTails();
  auto after = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(4), "completion after the restart");
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->history_size(), static_cast<int>(spec.rounds()));
  for (int i = 0; i < after->history_size(); ++i) {
    EXPECT_EQ(after->history(i).round(), static_cast<uint64_t>(i + 1));
    EXPECT_FALSE(after->history(i).participants().empty()) << "round " << i + 1;
    if (i > 0) {
      EXPECT_GT(after->history(i).model_version(), after->history(i - 1).model_version());
    }
  }

  // Nothing of the task's state is in the state directory but the checkpoint files.
  const std::string state = cluster.dir() + "/state";
  EXPECT_FALSE(std::filesystem::exists(state + "/coordinator.db"));
  EXPECT_FALSE(std::filesystem::is_empty(state + "/checkpoints"));
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({(*etcd)->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::string rounds = prefix + "/rounds/on-etcd/";
  absl::StatusOr<std::vector<etcd::KeyValue>> records =
      (*kv)->Range({rounds, etcd::EtcdKv::PrefixEnd(rounds)});
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), spec.rounds());
  const std::string task = prefix + "/tasks/on-etcd";
  absl::StatusOr<std::vector<etcd::KeyValue>> status = (*kv)->Range({task, ""});
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->size(), 1u);
  cv1::TaskStatus stored;
  ASSERT_TRUE(stored.ParseFromString((*status)[0].value));
  EXPECT_EQ(stored.state(), cv1::TASK_STATE_COMPLETED);
}

// One coordinator per prefix, fenced: a coordinator paused (SIGSTOP) past its hold's TTL loses
// the prefix to a second one that waited for it as its standby; resumed (SIGCONT), it writes
// nothing and steps down with exit code 1, and the second one serves the tasks.
TEST(CoordinatorEtcdClusterTest, APausedCoordinatorLosesItsPrefixAndStepsDown) {
  absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-cluster-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<EtcdMember>> etcd = EtcdMember::Start(*dir);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::vector<std::string> args = {"--store=etcd://" + (*etcd)->endpoint() + "/fenced",
                                         "--store-lease=2s"};
  std::filesystem::create_directories(*dir + "/first");
  std::filesystem::create_directories(*dir + "/second");
  Cluster first(*dir + "/first");
  ASSERT_TRUE(first.StartCoordinator(args).ok()) << first.LogTails();
  ASSERT_TRUE(first.CreateTask(SmallTask("kept")).ok());

  first.coordinator().process->Signal(SIGSTOP);
  Cluster second(*dir + "/second");
  // A standby at first; it serves once the paused one's hold has lapsed (its TTL, then etcd's
  // expiry check).
  ASSERT_TRUE(second.StartCoordinator(args).ok()) << second.LogTails();
  ASSERT_TRUE(second.WaitForCoordinatorServing(absl::Seconds(20)).ok());
  first.coordinator().process->Signal(SIGCONT);
  absl::StatusOr<process::ExitStatus> exit =
      first.coordinator().process->Wait(Scaled(absl::Seconds(20)));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << first.LogTails();
  EXPECT_EQ(exit->ToString(), "exit code 1");
  EXPECT_THAT(first.coordinator().process->LogTail(20),
              ::testing::HasSubstr("lost the hold on /fenced/owner"));

  absl::StatusOr<cv1::TaskStatus> kept = second.Status("kept");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->spec().rounds(), SmallTask("kept").rounds());
}

}  // namespace
}  // namespace shoal::testing
