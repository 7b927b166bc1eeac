// The coordinator on etcd (`--store etcd://...`), with real processes: two coordinators on one
// prefix of an etcd member; the one that lost its hold steps down. (A coordinator killed mid-task
// and the task resumed from etcd's records, the state directory holding the checkpoint files
// only: coordinator_ha_cluster_test.)

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
  // Its address file is written while it still answers as a standby (UNAVAILABLE) on its way to
  // holding the prefix: wait until it serves.
  ASSERT_TRUE(first.WaitForCoordinatorServing(absl::Seconds(20)).ok()) << first.LogTails();
  const absl::Status created = first.CreateTask(SmallTask("kept"));
  ASSERT_TRUE(created.ok()) << created;
  // CreateTask answers once the task is stored: it is in etcd now, before the pause (a task
  // acknowledged and then lost with the paused coordinator would fail below).
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({(*etcd)->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  absl::StatusOr<std::vector<etcd::KeyValue>> stored = (*kv)->Range({"/fenced/tasks/kept", ""});
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->size(), 1u) << "CreateTask answered before the task was stored";

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
