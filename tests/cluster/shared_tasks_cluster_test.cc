// Coordinators that share their tasks (--share-tasks), as real processes over mutual TLS (etcd's
// client API too): three etcd members, three coordinators on one key prefix and one checkpoint
// directory (--store-lease=2s), an aggregator registered with all three, and four peers given
// every coordinator address, two with the join token of a federated-sync task and two with
// that of a decentralized one. In one cluster:
// - the two tasks go to two different coordinators, and the third sends their callers there;
// - the owner of the federated-sync task is SIGKILLed in the middle of a round: the coordinator
//   with no task takes it over, its peers follow, and it completes;
// - the owner of the decentralized task is SIGSTOPped in the middle of a round, past its lease:
//   another takes the task over; SIGCONT: the old owner steps down (exit code 1, nothing
//   written: its writes are fenced on the task's owner key), and the task completes.
// Each task completes with every round once, in its history and in etcd's records, and the
// rounds closed and stored before the fault are kept as they were. Prints the fail-over times.
// In another cluster, one coordinator runs two federated-sync tasks while the other two are
// down; one of them starts again mid-round and is handed the newer task, which completes there
// as the older one does at the first.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

constexpr int kPeersPerTask = 2;
constexpr char kPrefix[] = "/shared";
const absl::Duration kLease = absl::Seconds(2);

common::v1::TaskSpec TaskWithToken(const std::string& name, common::v1::Mode mode, int rounds) {
  common::v1::TaskSpec spec = ShortTask(name, mode, rounds, kPeersPerTask);
  spec.set_join_token("token-" + name);
  return spec;
}

class SharedTasksClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-cluster-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    cluster_ = std::make_unique<Cluster>(*dir);
    Cluster& cluster = *cluster_;
    // Rounds of at least 30 x 20 ms = 0.6 s: the tests kill or pause a coordinator mid-round.
    cluster.set_batch_floor_ms(20);
    // With --share-tasks the other two serve at once, as the first.
    etcd_.Start(cluster, kPrefix, kLease, {"--share-tasks"});
    if (HasFatalFailure()) return;
    records_ = etcd_.records.get();
    coordinators_ = {&cluster.coordinator(), &cluster.standby(0), &cluster.standby(1)};
    for (Service* coordinator : coordinators_) {
      stubs_.push_back(cv1::ControlService::NewStub(
          rpc::MakeProbeChannel(coordinator->address, cluster.ClientCredentials())));
    }
    ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  }

  void TearDown() override {
    cluster_.reset();  // before etcd
    std::printf("test time: %s\n", absl::FormatDuration(absl::Now() - start_).c_str());
  }

  // GetTaskStatus at coordinator `i`.
  absl::StatusOr<cv1::TaskStatus> StatusAt(int i, const std::string& task) {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(2));
    context.set_wait_for_ready(true);  // as Cluster::WaitForCoordinatorServing's polls
    cv1::GetTaskStatusRequest request;
    request.set_name(task);
    cv1::GetTaskStatusResponse response;
    absl::Status s = rpc::FromGrpcStatus(stubs_[i]->GetTaskStatus(&context, request, &response));
    if (!s.ok()) return s;
    return response.status();
  }

  // Polls every running coordinator (but `skip`) for `task` until the one that serves it shows
  // a status for which `pred` holds; returns that coordinator's index in `owner`.
  absl::StatusOr<cv1::TaskStatus> WaitFor(const std::string& task,
                                          const std::function<bool(const cv1::TaskStatus&)>& pred,
                                          absl::Duration timeout, const std::string& what,
                                          int* owner = nullptr, int skip = -1) {
    absl::StatusOr<cv1::TaskStatus> last = absl::NotFoundError("no coordinator serves it");
    const bool done = WaitUntil(
        [&] {
          for (int i = 0; i < static_cast<int>(coordinators_.size()); ++i) {
            if (i == skip || !coordinators_[i]->process->Running()) continue;
            absl::StatusOr<cv1::TaskStatus> status = StatusAt(i, task);
            if (!status.ok()) continue;
            last = status;
            if (owner != nullptr) *owner = i;
            return pred(*status);
          }
          return false;
        },
        timeout, absl::Milliseconds(100));
    if (done) return last;
    return absl::DeadlineExceededError(absl::StrCat(
        "waiting for ", what, ": ", last.ok() ? last->ShortDebugString() : last.status().ToString(),
        "\n", cluster_->LogTails()));
  }

  // Waits for `spec`'s task to end, wherever it is served, and checks it.
  void ExpectCompletedEveryRoundOnce(const common::v1::TaskSpec& spec,
                                     const std::vector<cv1::TaskStatus>& seen) {
    auto after = WaitFor(
        spec.name(),
        [](const cv1::TaskStatus& s) {
          return s.state() != cv1::TASK_STATE_RUNNING && s.state() != cv1::TASK_STATE_WAITING;
        },
        Cluster::TaskBound(spec), "the end of " + spec.name());
    ASSERT_TRUE(after.ok()) << after.status();
    records_->ExpectCompletedEveryRoundOnce(spec, *after, seen, kPeersPerTask,
                                            AdoptedRounds(cluster_->dir(), spec.name()));
  }

  const absl::Time start_ = absl::Now();
  EtcdCluster etcd_;
  EtcdRecords* records_ = nullptr;
  std::unique_ptr<Cluster> cluster_;
  std::vector<Service*> coordinators_;
  std::vector<std::unique_ptr<cv1::ControlService::Stub>> stubs_;
};

TEST_F(SharedTasksClusterTest, TasksSpreadAndEachSurvivesItsCoordinatorsKillOrPause) {
  Cluster& cluster = *cluster_;
  const common::v1::TaskSpec federated =
      TaskWithToken("federated", common::v1::MODE_FEDERATED_SYNC, 4);
  const common::v1::TaskSpec decentralized =
      TaskWithToken("decentralized", common::v1::MODE_DECENTRALIZED, 20);

  // The aggregator registers with each coordinator.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(WaitUntil(
        [&] {
          grpc::ClientContext context;
          rpc::SetTimeout(context, absl::Seconds(2));
          cv1::ListNodesResponse nodes;
          return stubs_[i]->ListNodes(&context, cv1::ListNodesRequest(), &nodes).ok() &&
                 nodes.aggregators_size() == 1;
        },
        absl::Seconds(10)))
        << "coordinator " << i;
  }

  // Both tasks are created at the first coordinator; once the first is placed (and every
  // coordinator has read it), the second goes to another coordinator.
  ASSERT_TRUE(cluster.CreateTask(federated).ok());
  int federated_owner = -1;
  ASSERT_TRUE(WaitFor(
                  federated.name(), [](const cv1::TaskStatus&) { return true; }, absl::Seconds(10),
                  "the federated task served", &federated_owner)
                  .ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        grpc::ClientContext context;
        rpc::SetTimeout(context, absl::Seconds(2));
        cv1::ListTasksResponse listed;
        if (!stubs_[0]->ListTasks(&context, cv1::ListTasksRequest(), &listed).ok()) return false;
        for (const cv1::TaskStatus& t : listed.tasks()) {
          if (t.spec().name() == federated.name()) {
            return !absl::StrContains(t.message(), "being taken over");
          }
        }
        return false;
      },
      absl::Seconds(10)));
  ASSERT_TRUE(cluster.CreateTask(decentralized).ok());
  int decentralized_owner = -1;
  ASSERT_TRUE(WaitFor(
                  decentralized.name(), [](const cv1::TaskStatus&) { return true; },
                  absl::Seconds(10), "the decentralized task served", &decentralized_owner)
                  .ok());
  EXPECT_NE(federated_owner, decentralized_owner);
  // The third sends the callers of each task to its owner.
  const int third = 3 - federated_owner - decentralized_owner;
  ASSERT_GE(third, 0);
  ASSERT_LT(third, 3);
  absl::StatusOr<cv1::TaskStatus> refused = StatusAt(third, federated.name());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("served by coordinator " + coordinators_[federated_owner]->address));

  // The federated task's peers first: the decentralized task waits for its own meanwhile.
  ASSERT_TRUE(
      cluster.StartPeers(0, kPeersPerTask, 2 * kPeersPerTask, {"--join-token=token-federated"})
          .ok())
      << cluster.LogTails();

  // SIGKILL the federated task's owner mid-round: the coordinator with no open task takes it.
  auto before = WaitFor(
      federated.name(),
      [&](const cv1::TaskStatus& s) { return Training(s, 2) && records_->Stored(s); },
      absl::Minutes(2), "round 2 of the federated task");
  ASSERT_TRUE(before.ok()) << before.status();
  const absl::Time killed = absl::Now();
  coordinators_[federated_owner]->process->Signal(SIGKILL);
  int new_owner = -1;
  auto resumed = WaitFor(
      federated.name(), [](const cv1::TaskStatus&) { return true; }, absl::Seconds(20),
      "the federated task at another coordinator", &new_owner);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const absl::Duration taken_over = absl::Now() - killed;
  EXPECT_EQ(new_owner, third);
  auto next = WaitFor(
      federated.name(),
      [&](const cv1::TaskStatus& s) {
        return s.history_size() > 0 && s.history(s.history_size() - 1).round() >= before->round();
      },
      absl::Minutes(1), "the interrupted round closed at the new owner");
  ASSERT_TRUE(next.ok()) << next.status();
  std::printf(
      "kill of the federated task's owner: taken over after %s, its round %llu closed "
      "after %s\n",
      absl::FormatDuration(taken_over).c_str(), static_cast<unsigned long long>(before->round()),
      absl::FormatDuration(absl::Now() - killed).c_str());
  ExpectCompletedEveryRoundOnce(federated, {*before});
  if (HasFatalFailure()) return;
  ASSERT_TRUE(cluster
                  .StartPeers(kPeersPerTask, kPeersPerTask, 2 * kPeersPerTask,
                              {"--join-token=token-decentralized"})
                  .ok())
      << cluster.LogTails();

  // SIGSTOP the decentralized task's owner mid-round, past its lease: another takes the task;
  // SIGCONT: the old owner finds its lease gone and steps down, having written nothing.
  auto paused_at = WaitFor(
      decentralized.name(),
      [&](const cv1::TaskStatus& s) { return Training(s, 2) && records_->Stored(s); },
      absl::Minutes(2), "round 2 of the decentralized task");
  ASSERT_TRUE(paused_at.ok()) << paused_at.status();
  process::Process& paused = *coordinators_[decentralized_owner]->process;
  const absl::Time stopped = absl::Now();
  paused.Signal(SIGSTOP);
  int taker = -1;
  auto taken = WaitFor(
      decentralized.name(), [](const cv1::TaskStatus&) { return true; }, absl::Seconds(20),
      "the decentralized task at another coordinator", &taker, decentralized_owner);
  ASSERT_TRUE(taken.ok()) << taken.status();
  // Not before its lease could lapse: renewed every third of it, so at least two thirds.
  EXPECT_GE(absl::Now() - stopped, kLease / 2);
  std::printf("pause of the decentralized task's owner: taken over after %s\n",
              absl::FormatDuration(absl::Now() - stopped).c_str());
  paused.Signal(SIGCONT);
  absl::StatusOr<process::ExitStatus> exit = paused.Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << paused.LogTail(20);
  EXPECT_FALSE(exit->success()) << exit->ToString();
  EXPECT_THAT(paused.LogTail(40), HasSubstr("lost the hold on"));
  ExpectCompletedEveryRoundOnce(decentralized, {*paused_at});
}

TEST_F(SharedTasksClusterTest, ACoordinatorThatComesBackIsHandedARunningTask) {
  Cluster& cluster = *cluster_;
  // Only the first coordinator serves: the others stop (SIGTERM lets their leases go at once).
  for (int i : {1, 2}) {
    coordinators_[i]->process->Signal(SIGTERM);
    ASSERT_TRUE(coordinators_[i]->process->Wait(absl::Seconds(20)).ok());
  }
  const common::v1::TaskSpec older = TaskWithToken("older", common::v1::MODE_FEDERATED_SYNC, 16);
  const common::v1::TaskSpec newer = TaskWithToken("newer", common::v1::MODE_FEDERATED_SYNC, 16);
  for (const common::v1::TaskSpec& spec : {older, newer}) {
    ASSERT_TRUE(cluster.CreateTask(spec).ok());
    int owner = -1;
    ASSERT_TRUE(WaitFor(
                    spec.name(), [](const cv1::TaskStatus&) { return true; }, absl::Seconds(10),
                    spec.name() + " served", &owner)
                    .ok());
    ASSERT_EQ(owner, 0);
  }
  ASSERT_TRUE(
      cluster.StartPeers(0, kPeersPerTask, 2 * kPeersPerTask, {"--join-token=token-older"}).ok())
      << cluster.LogTails();
  ASSERT_TRUE(
      cluster
          .StartPeers(kPeersPerTask, kPeersPerTask, 2 * kPeersPerTask, {"--join-token=token-newer"})
          .ok())
      << cluster.LogTails();
  std::vector<cv1::TaskStatus> before;
  for (const common::v1::TaskSpec& spec : {older, newer}) {
    auto training = WaitFor(
        spec.name(),
        [&](const cv1::TaskStatus& s) { return Training(s, 2) && records_->Stored(s); },
        absl::Minutes(2), "round 2 of " + spec.name());
    ASSERT_TRUE(training.ok()) << training.status();
    before.push_back(*training);
  }

  // The second coordinator comes back serving nothing: two tasks against none, for 2 s.
  const absl::Time back = absl::Now();
  ASSERT_TRUE(cluster.RestartStandby(0).ok()) << cluster.LogTails();
  int newer_owner = -1;
  auto moved = WaitFor(
      newer.name(), [](const cv1::TaskStatus&) { return true; }, absl::Seconds(20),
      "the newer task at the coordinator that came back", &newer_owner, /*skip=*/0);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(newer_owner, 1);
  std::printf("a coordinator back: handed the newer task (round %llu) after %s\n",
              static_cast<unsigned long long>(moved->round()),
              absl::FormatDuration(absl::Now() - back).c_str());
  EXPECT_TRUE(StatusAt(0, older.name()).ok());  // one each: the older one stays
  ExpectCompletedEveryRoundOnce(newer, {before[1]});
  ExpectCompletedEveryRoundOnce(older, {before[0]});
  int older_owner = -1;
  ASSERT_TRUE(WaitFor(
                  older.name(), [](const cv1::TaskStatus&) { return true; }, absl::Seconds(5),
                  "the older task", &older_owner)
                  .ok());
  EXPECT_EQ(older_owner, 0);
  EXPECT_THAT(coordinators_[0]->process->LogTail(400), HasSubstr("task newer: handing it over"));
  // What it kept for the task handed over is freed: it holds the work queues of one task.
  double queues = -1;
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<std::string> page = HttpGet(coordinators_[0]->metrics_address, "/metrics");
        if (page.ok()) queues = MetricValue(*page, "shoal_coordinator_task_work_queues");
        return queues == 1;
      },
      absl::Seconds(10), absl::Milliseconds(100)))
      << "shoal_coordinator_task_work_queues " << queues;
}

}  // namespace
}  // namespace shoal::testing
