// The ownership of tasks that coordinators share on one etcd prefix (--share-tasks), through
// their stores, against a real etcd member: claims, fenced writes, orphans taken by the least
// loaded, a lost lease, a task handed over to even out the load. Real coordinators sharing
// their tasks: shared_tasks_test.cc.

#include "services/coordinator/store/task_ownership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/etcd/etcd_kv.h"
#include "services/coordinator/task_placement.h"
#include "services/coordinator/task_store.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/etcd_suite.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TaskOwnershipTest : public testing::WithEtcdMember<> {
 protected:
  void SetUp() override {
    ASSERT_NE(etcd(), nullptr);
    absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-shared-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    prefix_ = NewPrefix("shared");
    url_ = absl::StrCat("etcd://", etcd()->endpoint(), prefix_);
  }

  // A store that shares the prefix's tasks as the coordinator at `address`.
  std::unique_ptr<TaskStore> Open(const std::string& address,
                                  std::function<void(const absl::Status&)> on_lost = nullptr) {
    StoreOptions options;
    options.store = url_;
    options.state_dir = dir_;
    options.lease_ttl = absl::Seconds(2);
    options.share_tasks = true;
    options.advertise = address;
    options.on_lost = std::move(on_lost);
    absl::StatusOr<std::unique_ptr<TaskStore>> store = OpenTaskStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    EXPECT_NE((*store)->placement(), nullptr);
    return *std::move(store);
  }

  static TaskOwnership& Ownership(TaskStore& store) {
    return *static_cast<TaskOwnership*>(store.placement());
  }

  static v1::TaskStatus Task(const std::string& name, const std::string& join_token = "") {
    v1::TaskStatus status;
    status.mutable_spec()->set_name(name);
    status.mutable_spec()->set_join_token(join_token);
    status.set_state(v1::TASK_STATE_WAITING);
    return status;
  }

  std::string dir_;
  std::string prefix_;
  std::string url_;
};

TEST_F(TaskOwnershipTest, TheCreatorOwnsATaskAndOnlyItsWritesLand) {
  std::unique_ptr<TaskStore> a = Open("a:1");
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(a && b);
  // Neither serves a task: the lower address, a, owns the new one.
  EXPECT_TRUE(a->placement()->Claim(Task("t", "secret")).value_or(false));
  EXPECT_TRUE(a->placement()->Claim(Task("t", "secret")).value_or(false));  // a's already
  ASSERT_TRUE(a->PutTask(Task("t", "secret")).ok());
  ASSERT_TRUE(a->PutRound("t", v1::RoundSummary()).ok());

  absl::Status claim = b->placement()->Claim(Task("t")).status();
  EXPECT_EQ(claim.code(), absl::StatusCode::kUnavailable) << claim;
  EXPECT_THAT(claim.message(), HasSubstr("served by coordinator a:1"));
  absl::Status write = b->PutTask(Task("t"));
  EXPECT_EQ(write.code(), absl::StatusCode::kFailedPrecondition) << write;
  EXPECT_EQ(b->DeleteRoundsAfter("t", 0).code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_THAT(b->placement()->Elsewhere("t").message(), HasSubstr("served by coordinator a:1"));
  EXPECT_EQ(b->placement()->Elsewhere("nothing").code(), absl::StatusCode::kNotFound);

  // b knows a's open task once it has scanned: listed without its join token, and where a
  // peer with that token goes.
  absl::StatusOr<std::vector<std::string>> taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(taken->empty());
  std::vector<v1::TaskStatus> others = b->placement()->OthersTasks();
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].spec().name(), "t");
  EXPECT_EQ(others[0].spec().join_token(), "");
  EXPECT_EQ(b->placement()->OpenTaskFor("secret", false).value_or(""), "a:1");
  EXPECT_FALSE(b->placement()->OpenTaskFor("wrong", false).has_value());
  EXPECT_FALSE(a->placement()->OpenTaskFor("secret", false).has_value());  // its own: not elsewhere
  EXPECT_EQ(b->placement()->OpenTaskFor("secret", true).value_or(""), "a:1");  // it waits
  v1::TaskStatus running = Task("t", "secret");
  running.set_state(v1::TASK_STATE_RUNNING);
  ASSERT_TRUE(a->PutTask(running).ok());
  ASSERT_TRUE(Ownership(*b).ScanOnce().ok());
  EXPECT_FALSE(b->placement()->OpenTaskFor("secret", true).has_value());
  EXPECT_EQ(b->placement()->OpenTaskFor("secret", false).value_or(""), "a:1");

  // A new task goes to the coordinator with the fewest open tasks: a, which has one, stores
  // it for b, and b takes it on its next scan.
  absl::StatusOr<bool> placed = a->placement()->Claim(Task("u"));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_FALSE(*placed);
  EXPECT_EQ(a->PutTask(Task("u")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->placement()->Claim(Task("u")).status().code(), absl::StatusCode::kUnavailable);
  taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre("u"));
  EXPECT_TRUE(b->PutTask(Task("u")).ok());
  // Completed tasks are no load: with t done, a is the least loaded again.
  v1::TaskStatus done = Task("t");
  done.set_state(v1::TASK_STATE_COMPLETED);
  ASSERT_TRUE(a->PutTask(done).ok());
  EXPECT_TRUE(a->placement()->Claim(Task("v")).value_or(false));
}

TEST_F(TaskOwnershipTest, TheTasksOfACoordinatorThatWentAreSharedByTheLeastLoaded) {
  // a alone creates five tasks: all its own.
  std::unique_ptr<TaskStore> a = Open("a:1");
  ASSERT_TRUE(a);
  for (const char* name : {"t1", "t2", "t3", "t4", "t5"}) {
    ASSERT_TRUE(a->placement()->Claim(Task(name)).value_or(false));
    ASSERT_TRUE(a->PutTask(Task(name)).ok());
  }
  std::unique_ptr<TaskStore> b = Open("b:1");
  std::unique_ptr<TaskStore> c = Open("c:1");
  ASSERT_TRUE(b && c);
  a.reset();  // revokes its lease: its owner keys go with it

  // b scans first and takes the orphans that fall to it; c takes the rest on its scan. Each
  // goes to the one with fewer tasks, the lower address among equals: b, c, b, c, b.
  absl::StatusOr<std::vector<std::string>> by_b = Ownership(*b).ScanOnce();
  ASSERT_TRUE(by_b.ok()) << by_b.status();
  absl::StatusOr<std::vector<std::string>> by_c = Ownership(*c).ScanOnce();
  ASSERT_TRUE(by_c.ok()) << by_c.status();
  EXPECT_THAT(*by_b, ElementsAre("t1", "t3", "t5"));
  EXPECT_THAT(*by_c, ElementsAre("t2", "t4"));
  ASSERT_TRUE(b->PutTask(Task("t1")).ok());
  EXPECT_EQ(c->PutTask(Task("t1")).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->PutTask(Task("t2")).ok());
  absl::StatusOr<StoredTask> loaded = b->LoadTask("t3", 10);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->status.spec().name(), "t3");
  EXPECT_EQ(b->LoadTask("none", 10).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TaskOwnershipTest, NewTasksSpreadOverTheCoordinators) {
  std::unique_ptr<TaskStore> a = Open("a:1");
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(a && b);
  // Three tasks created at a in a row, before any scan: the first is a's (the lower address of
  // two without tasks); the second is stored for b (a has one), and counted there; the third
  // is a's again. b's scan takes the second.
  for (const char* name : {"t1", "t2", "t3"}) {
    absl::StatusOr<bool> mine = a->placement()->Claim(Task(name));
    ASSERT_TRUE(mine.ok()) << mine.status();
    EXPECT_EQ(*mine, std::string(name) != "t2") << name;
    if (*mine) {
      ASSERT_TRUE(a->PutTask(Task(name)).ok());
    }
  }
  absl::StatusOr<std::vector<std::string>> by_b = Ownership(*b).ScanOnce();
  ASSERT_TRUE(by_b.ok()) << by_b.status();
  EXPECT_THAT(*by_b, ElementsAre("t2"));
  absl::StatusOr<std::vector<std::string>> by_a = Ownership(*a).ScanOnce();
  ASSERT_TRUE(by_a.ok()) << by_a.status();
  EXPECT_TRUE(by_a->empty());
}

TEST_F(TaskOwnershipTest, ACoordinatorWhoseLeaseLapsedWritesNothingAndItsTasksMove) {
  absl::Mutex mu;
  std::string lost;
  std::unique_ptr<TaskStore> a = Open("a:1", [&](const absl::Status& why) {
    absl::MutexLock lock(&mu);
    lost = std::string(why.message());
  });
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->placement()->Claim(Task("t")).value_or(false));
  ASSERT_TRUE(a->PutTask(Task("t")).ok());

  // a's lease goes behind its back (as when it was paused past its TTL).
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({etcd()->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::string key = TaskOwnership::MemberKey(prefix_, "a:1");
  absl::StatusOr<std::vector<etcd::KeyValue>> member = (*kv)->Range({key, key + '\0'});
  ASSERT_TRUE(member.ok() && member->size() == 1u);
  ASSERT_TRUE((*kv)->RevokeLease((*member)[0].lease).ok());

  absl::StatusOr<std::vector<std::string>> taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre("t"));
  absl::Status late = a->PutTask(Task("t"));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  ASSERT_TRUE(b->PutTask(Task("t")).ok());
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return !lost.empty();
      },
      absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_THAT(lost, HasSubstr("lost the hold on"));
}

TEST_F(TaskOwnershipTest, ACoordinatorWithTwoTasksMoreThanAnotherHandsOneOver) {
  // a alone: three open tasks, all its own; the newest waiting one is the one to hand over.
  std::unique_ptr<TaskStore> a = Open("a:1");
  ASSERT_TRUE(a);
  int64_t created = 1000;
  for (const char* name : {"t1", "t2", "t3", "t4"}) {
    v1::TaskStatus task = Task(name);
    task.set_created_unix_ms(created++);
    if (std::string(name) == "t4") task.set_state(v1::TASK_STATE_RUNNING);  // newest, but running
    ASSERT_TRUE(a->placement()->Claim(task).value_or(false)) << name;
    ASSERT_TRUE(a->PutTask(task).ok());
  }
  v1::TaskStatus done = Task("t1");
  done.set_state(v1::TASK_STATE_COMPLETED);  // no load
  ASSERT_TRUE(a->PutTask(done).ok());
  const int after = TaskOwnershipOptions().hand_off_after;
  // Alone, a is the least loaded: nothing to hand over however long it scans.
  for (int i = 0; i < after + 1; ++i) ASSERT_TRUE(Ownership(*a).ScanOnce().ok());
  EXPECT_FALSE(Ownership(*a).TakeHandOff().has_value());

  // b joins: a serves three open tasks, b none. Only a lasting imbalance counts.
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(b);
  for (int i = 0; i < after - 1; ++i) {
    ASSERT_TRUE(Ownership(*a).ScanOnce().ok());
    ASSERT_FALSE(Ownership(*a).TakeHandOff().has_value()) << "after " << i + 1 << " scans";
  }
  ASSERT_TRUE(Ownership(*a).ScanOnce().ok());
  EXPECT_EQ(Ownership(*a).TakeHandOff().value_or(""), "t3");
  EXPECT_FALSE(Ownership(*a).TakeHandOff().has_value());  // taken once
  ASSERT_TRUE(Ownership(*b).ScanOnce().ok());
  EXPECT_FALSE(Ownership(*b).TakeHandOff().has_value());  // b is the least loaded

  // a's core stops serving t3 and releases it: a writes nothing more about it, b takes it.
  ASSERT_TRUE(a->placement()->Release("t3").ok());
  EXPECT_EQ(a->PutTask(Task("t3")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a->placement()->Release("t3").ok());  // held no more: nothing to give up
  absl::StatusOr<std::vector<std::string>> taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre("t3"));
  ASSERT_TRUE(b->PutTask(Task("t3")).ok());
  // Two against one: even enough.
  for (int i = 0; i < 2 * after; ++i) ASSERT_TRUE(Ownership(*a).ScanOnce().ok());
  EXPECT_FALSE(Ownership(*a).TakeHandOff().has_value());
}

// A coordinator's load counts each task's peers: of two tasks, the one light enough to narrow the
// gap moves, not the newer one with six peers, and a coordinator of three peerless tasks does not
// hand one to another that serves a task of six peers.
TEST_F(TaskOwnershipTest, ATaskWeighsOneAndOneMorePerPeer) {
  std::unique_ptr<TaskStore> a = Open("a:1");
  ASSERT_TRUE(a);
  v1::TaskStatus small = Task("small");
  small.set_created_unix_ms(1000);
  v1::TaskStatus big = Task("big");
  big.set_created_unix_ms(1001);  // the newer, waiting too
  for (int i = 0; i < 6; ++i) big.add_data()->set_peer_id(absl::StrCat("peer-", i));
  for (const v1::TaskStatus& task : {small, big}) {
    ASSERT_TRUE(a->placement()->Claim(task).value_or(false)) << task.spec().name();
    ASSERT_TRUE(a->PutTask(task).ok());
  }
  // b joins: loads 1 + 7 against 0. "big" (7) would only turn the gap around; "small" moves.
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(b);
  const int after = TaskOwnershipOptions().hand_off_after;
  for (int i = 0; i < after; ++i) ASSERT_TRUE(Ownership(*a).ScanOnce().ok());
  EXPECT_EQ(Ownership(*a).TakeHandOff().value_or(""), "small");
  ASSERT_TRUE(a->placement()->Release("small").ok());
  absl::StatusOr<std::vector<std::string>> taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre("small"));
  ASSERT_TRUE(b->PutTask(small).ok());

  // b, the least loaded, gets the next two tasks: three tasks (3) against one of six peers (7).
  for (const char* name : {"x", "y"}) {
    ASSERT_TRUE(b->placement()->Claim(Task(name)).value_or(false)) << name;
    ASSERT_TRUE(b->PutTask(Task(name)).ok());
  }
  for (int i = 0; i < 2 * after; ++i) {
    ASSERT_TRUE(Ownership(*a).ScanOnce().ok());
    ASSERT_TRUE(Ownership(*b).ScanOnce().ok());
  }
  EXPECT_FALSE(Ownership(*a).TakeHandOff().has_value()) << "a's one task would turn the gap round";
  EXPECT_FALSE(Ownership(*b).TakeHandOff().has_value()) << "b is the less loaded";
}

}  // namespace
}  // namespace shoal::coordinator
