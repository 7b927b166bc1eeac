// Replicated coordinators with no single point of failure, as real processes over mutual TLS
// (etcd's client API too: --store-tls): three etcd members, three coordinators on one key prefix
// and one checkpoint directory (one active, two standbys, --store-lease=2s), an aggregator and two
// peers given every coordinator address. In one cluster:
// - the standbys refuse every call, naming the active coordinator;
// - the active coordinator is SIGKILLed in the middle of a federated-sync round;
// - the next active one in the middle of a decentralized round;
// - then the etcd leader, while the decentralized task trains on (the coordinator keeps its hold,
//   or, when the election outlasts the lease on a loaded machine, steps down for a standby).
// After each coordinator kill a standby serves, every peer is back at it within the lease, and
// the killed coordinator comes back as a standby (as a restarted pod would). Each task completes
// with every round exactly once, in its history and in etcd's records, and the rounds closed and
// stored before a kill are kept as they were (no acknowledged update is lost). Each kill waits
// until the closed rounds and the newest checkpoint's record are in etcd; before the first, the
// checkpoint files are deleted, so the coordinator taking over must take the newest version from
// the aggregator that holds it (docs/how-to/high-availability.md). The aggregator moves on to each
// new coordinator too, and the state directory holds the checkpoint files only: the tasks' state is
// etcd's, a completed task's record there included. Prints the fail-over times and the test's
// time.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/etcd/etcd_kv.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "tests/cluster/cluster.h"
#include "tests/cluster/etcd_cluster.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::HasSubstr;

constexpr int kPeers = 2;
constexpr char kPrefix[] = "/ha";
const absl::Duration kLease = absl::Seconds(2);

common::v1::TaskSpec ShortTask(const std::string& name, common::v1::Mode mode, int rounds) {
  return testing::ShortTask(name, mode, rounds, kPeers);
}

class CoordinatorHaClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-cluster-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    cluster_ = std::make_unique<Cluster>(*dir);
    Cluster& cluster = *cluster_;
    // Rounds of at least 30 x 20 ms = 0.6 s: the tests kill or pause a coordinator mid-round.
    cluster.set_batch_floor_ms(20);
    // etcd over mutual TLS too, with the cluster's CA (--store-tls).
    etcd_.Start(cluster, kPrefix, kLease);
    if (HasFatalFailure()) return;
    records_ = etcd_.records.get();
    ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
    ASSERT_TRUE(cluster.StartPeers(0, kPeers, kPeers).ok()) << cluster.LogTails();
  }

  void TearDown() override {
    cluster_.reset();  // before etcd
    std::printf("test time: %s\n", absl::FormatDuration(absl::Now() - start_).c_str());
  }

  // Kills the active coordinator while `spec`'s round `round` (or a later one) trains, its
  // closed rounds stored, and checks the fail-over: a standby serves, both peers are back at it
  // within the lease, and the interrupted round closes there. The killed coordinator comes back
  // as a standby. Returns, in `seen`, the task's status read before the kill. With
  // `lose_checkpoint_files`, the checkpoint directory is emptied before the kill (a disk the
  // next coordinator cannot see).
  void FailOverMidRound(const common::v1::TaskSpec& spec, uint64_t round, cv1::TaskStatus* seen,
                        bool lose_checkpoint_files = false) {
    Cluster& cluster = *cluster_;
    auto before = cluster.WaitFor(
        spec.name(),
        [&](const cv1::TaskStatus& s) { return Training(s, round) && records_->Stored(s); },
        absl::Minutes(2), absl::StrCat("round ", round, " of ", spec.name()));
    ASSERT_TRUE(before.ok()) << before.status();
    *seen = *before;
    if (lose_checkpoint_files) {
      const std::string checkpoints = cluster.dir() + "/state/checkpoints";
      ASSERT_FALSE(std::filesystem::is_empty(checkpoints));
      for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
        std::filesystem::remove(entry.path());
      }
    }
    const uint64_t interrupted = before->round();
    const absl::Time killed = absl::Now();
    absl::StatusOr<absl::Duration> serving = cluster.KillCoordinatorForStandby(absl::Seconds(20));
    ASSERT_TRUE(serving.ok()) << serving.status();
    absl::Status back = cluster.WaitForPeersConnected(kPeers, kLease);
    const absl::Duration peers_back = absl::Now() - killed - *serving;
    EXPECT_TRUE(back.ok()) << "the peers were not back within the lease (" << kLease
                           << ") after a standby served: " << back;
    auto next = cluster.WaitFor(
        spec.name(),
        [&](const cv1::TaskStatus& s) {
          return s.history_size() > 0 && s.history(s.history_size() - 1).round() >= interrupted;
        },
        absl::Minutes(1), absl::StrCat("round ", interrupted, " closed at the new coordinator"));
    ASSERT_TRUE(next.ok()) << next.status();
    std::printf(
        "fail-over (%s, round %llu): kill -> a standby serving %s, then the peers back %s; "
        "kill -> the round closed %s\n",
        spec.name().c_str(), static_cast<unsigned long long>(interrupted),
        absl::FormatDuration(*serving).c_str(), absl::FormatDuration(peers_back).c_str(),
        absl::FormatDuration(absl::Now() - killed).c_str());
    for (int i = 0; i < cluster.standby_count(); ++i) {
      if (!cluster.standby(i).process->Running()) {
        ASSERT_TRUE(cluster.RestartStandby(i).ok()) << cluster.LogTails();
      }
    }
  }

  // Waits for `spec` to complete and checks it (EtcdRecords::ExpectCompletedEveryRoundOnce).
  void ExpectCompletedEveryRoundOnce(const common::v1::TaskSpec& spec,
                                     const std::vector<cv1::TaskStatus>& seen) {
    auto after = cluster_->WaitForEnd(spec);
    ASSERT_TRUE(after.ok()) << after.status();
    records_->ExpectCompletedEveryRoundOnce(spec, *after, seen, kPeers,
                                            AdoptedRounds(cluster_->dir(), spec.name()));
  }

  const absl::Time start_ = absl::Now();
  EtcdCluster etcd_;
  EtcdRecords* records_ = nullptr;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(CoordinatorHaClusterTest, TwoCoordinatorKillsAndAnEtcdMembersLossLoseNoRound) {
  Cluster& cluster = *cluster_;
  // Each standby refuses every call, naming the active coordinator.
  for (int i = 0; i < cluster.standby_count(); ++i) {
    auto standby = cv1::ControlService::NewStub(
        rpc::MakeProbeChannel(cluster.standby(i).address, cluster.ClientCredentials()));
    absl::Status refused;
    WaitUntil(
        [&] {
          grpc::ClientContext context;
          rpc::SetTimeout(context, absl::Seconds(2));
          context.set_wait_for_ready(true);  // as Cluster::WaitForCoordinatorServing's polls
          cv1::ListTasksResponse response;
          refused =
              rpc::FromGrpcStatus(standby->ListTasks(&context, cv1::ListTasksRequest(), &response));
          return absl::StrContains(refused.message(), cluster.coordinator().address);
        },
        absl::Seconds(10));
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("standby"));
    EXPECT_THAT(refused.message(), HasSubstr(cluster.coordinator().address));
  }

  const common::v1::TaskSpec federated =
      ShortTask("ha-federated", common::v1::MODE_FEDERATED_SYNC, 4);
  ASSERT_TRUE(cluster.CreateTask(federated).ok());
  cv1::TaskStatus seen;
  FailOverMidRound(federated, 2, &seen, /*lose_checkpoint_files=*/true);
  if (HasFatalFailure()) return;
  ExpectCompletedEveryRoundOnce(federated, {seen});
  if (HasFatalFailure()) return;
  // The aggregator moved on to the new coordinator with the peers.
  absl::StatusOr<cv1::ListNodesResponse> nodes = cluster.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->aggregators_size(), 1) << nodes->ShortDebugString();
  // Nothing of the tasks' state is in the state directory but the checkpoint files; etcd holds
  // the completed task's record.
  const std::string state = cluster.dir() + "/state";
  EXPECT_FALSE(std::filesystem::exists(state + "/coordinator.db"));
  EXPECT_FALSE(std::filesystem::is_empty(state + "/checkpoints"));
  std::optional<cv1::TaskStatus> stored;
  EXPECT_TRUE(WaitUntil(
      [&] {
        stored = records_->Task(federated.name());
        return stored.has_value() && stored->state() == cv1::TASK_STATE_COMPLETED;
      },
      absl::Seconds(10), absl::Milliseconds(100)))
      << (stored ? stored->ShortDebugString() : "no record");

  const common::v1::TaskSpec decentralized =
      ShortTask("ha-decentralized", common::v1::MODE_DECENTRALIZED, 6);
  ASSERT_TRUE(cluster.CreateTask(decentralized).ok());
  FailOverMidRound(decentralized, 2, &seen);
  if (HasFatalFailure()) return;

  // The etcd leader goes while the task trains on: the other two members keep the store. The
  // coordinator keeps its hold when they elect a leader within the lease; on a loaded machine
  // the election can take longer, the coordinator steps down, and a standby takes over (the
  // cluster's calls follow it, as the peers do). Either way no round is lost or repeated; a
  // round the peers completed after the coordinator lost etcd keeps its model, not its
  // participants (AdoptedRounds).
  auto training = cluster.WaitFor(
      decentralized.name(),
      [&](const cv1::TaskStatus& s) { return Training(s, 4) && records_->Stored(s); },
      absl::Minutes(1), "round 4 of the decentralized task");
  ASSERT_TRUE(training.ok()) << training.status();
  int leader = -1;
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (int i = 0; i < static_cast<int>(etcd_.members.size()); ++i) {
          if (etcd_.members[i]->IsLeader()) leader = i;
        }
        return leader >= 0;
      },
      absl::Seconds(10), absl::Milliseconds(100)));
  const int step_downs = cluster.step_downs_followed();
  etcd_.members[leader]->Kill();
  ExpectCompletedEveryRoundOnce(decentralized, {seen, *training});
  if (HasFatalFailure()) return;
  std::printf("the etcd leader's loss: %s\n",
              cluster.step_downs_followed() == step_downs
                  ? "the coordinator kept its hold"
                  : "the coordinator stepped down, a standby took over");
  EXPECT_TRUE(cluster.coordinator().process->Running()) << cluster.LogTails();
  EXPECT_TRUE(cluster.WaitForPeersConnected(kPeers, kLease).ok());
}

}  // namespace
}  // namespace shoal::testing
