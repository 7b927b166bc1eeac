// Deleting ended tasks: by an operator (CoordinatorCore::DeleteTask) and past
// --keep-ended-tasks (CoordinatorOptions::keep_ended_tasks). The store is the real SQLite store
// in a temp dir, checkpoint files included.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "services/coordinator/coordinator_core.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
using core_testing::Spec;
using ::testing::HasSubstr;

double Deleted(prometheus::Registry& registry, const std::string& by) {
  for (const auto& family : registry.Collect()) {
    if (family.name != "shoal_coordinator_tasks_deleted_total") continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "by" && label.value == by) return metric.counter.value;
      }
    }
  }
  return 0;
}

double WorkQueues(prometheus::Registry& registry) {
  for (const auto& family : registry.Collect()) {
    if (family.name == "shoal_coordinator_task_work_queues") return family.metric.at(0).gauge.value;
  }
  return -1;
}

TEST_F(CoordinatorCoreTest, ADeletedTaskLeavesWithItsRecordsAndCheckpointFilesOnly) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();  // round 1 closes: version 1 is checkpointed
  absl::StatusOr<StoredCheckpoint> checkpoint = store_->GetCheckpoint("t", std::nullopt);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_TRUE(std::filesystem::exists(checkpoint->path));
  ASSERT_TRUE(core_->CreateTask(Spec("u", 1, 5)).ok());
  RunWork();

  absl::Status refused = core_->DeleteTask("t", [](const absl::Status&) { ADD_FAILURE(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("stop it first"));
  EXPECT_EQ(core_->DeleteTask("nope", nullptr).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(core_->StopTask("t").ok());
  EXPECT_GT(Status("t").ended_unix_ms(), 0);

  std::optional<absl::Status> watch_ended;
  absl::StatusOr<uint64_t> watch = core_->Watch(
      "t", [](const v1::TaskStatus&) {}, [&](const absl::Status& why) { watch_ended = why; });
  ASSERT_TRUE(watch.ok());
  absl::Cleanup unwatch = [&] { core_->Unwatch(*watch); };
  std::optional<absl::Status> done;
  const double queues = WorkQueues(registry_);
  ASSERT_GE(queues, 1) << "the task's aggregator work has queues";
  ASSERT_TRUE(core_->DeleteTask("t", [&](const absl::Status& s) { done = s; }).ok());
  // Gone from the operators' view at once; from the store once the queued work has run.
  EXPECT_EQ(core_->GetTaskStatus("t").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(done.has_value());
  EXPECT_EQ(core_->CreateTask(Spec("t", 1, 5)).status().code(), absl::StatusCode::kUnavailable)
      << "a task of the name cannot be created while the old one is being deleted";
  RunWork();
  ASSERT_TRUE(watch_ended.has_value());
  EXPECT_EQ(watch_ended->code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << *done;
  EXPECT_EQ(store_->LoadTask("t", 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->ListCheckpoints("t")->empty());
  EXPECT_FALSE(std::filesystem::exists(checkpoint->path));
  EXPECT_TRUE(store_->LoadTask("u", 10).ok()) << "another task is kept";
  EXPECT_EQ(Deleted(registry_, "operator"), 1);
  EXPECT_EQ(WorkQueues(registry_), queues - 1) << "the task's work queues are freed";
  // An aggregator that still holds it (cut off when it ended) is told to free it for a while;
  // never a task this coordinator does not know.
  EXPECT_THAT(core_->TasksToRelease("127.0.0.1:5555", {"t", "elsewhere"}),
              ::testing::ElementsAre("t"));
  clock_.Advance(kReleaseDeleted);
  Step();
  EXPECT_THAT(core_->TasksToRelease("127.0.0.1:5555", {"t"}), ::testing::IsEmpty());

  Recreate();  // a restart finds it gone, and a new task may take the name
  EXPECT_EQ(core_->GetTaskStatus("t").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
}

// The SQLite store, whose DeleteTask fails while `refuse` is set.
class RefusingStore final : public TaskStore {
 public:
  explicit RefusingStore(std::unique_ptr<TaskStore> store) : store_(std::move(store)) {}
  absl::Status PutTask(const v1::TaskStatus& s) override { return store_->PutTask(s); }
  absl::Status PutRound(const std::string& t, const v1::RoundSummary& r) override {
    return store_->PutRound(t, r);
  }
  absl::Status PutCheckpoint(const StoredCheckpoint& c) override {
    return store_->PutCheckpoint(c);
  }
  absl::StatusOr<std::vector<StoredTask>> LoadTasks(size_t limit) override {
    return store_->LoadTasks(limit);
  }
  absl::StatusOr<StoredTask> LoadTask(const std::string& t, size_t limit) override {
    return store_->LoadTask(t, limit);
  }
  absl::StatusOr<std::vector<v1::RoundSummary>> LoadRounds(const std::string& t, uint64_t after,
                                                           size_t limit) override {
    return store_->LoadRounds(t, after, limit);
  }
  absl::Status DeleteRoundsAfter(const std::string& t, uint64_t round) override {
    return store_->DeleteRoundsAfter(t, round);
  }
  absl::StatusOr<StoredCheckpoint> GetCheckpoint(const std::string& t,
                                                 std::optional<uint64_t> v) override {
    return store_->GetCheckpoint(t, v);
  }
  absl::StatusOr<std::vector<StoredCheckpoint>> ListCheckpoints(const std::string& t) override {
    return store_->ListCheckpoints(t);
  }
  absl::StatusOr<std::vector<StoredCheckpoint>> ListAllCheckpoints() override {
    return store_->ListAllCheckpoints();
  }
  absl::Status DeleteCheckpointsBefore(const std::string& t, uint64_t v) override {
    return store_->DeleteCheckpointsBefore(t, v);
  }
  absl::Status DeleteTask(const std::string& t) override {
    if (refuse) return absl::UnavailableError("etcd: no member answered");
    return store_->DeleteTask(t);
  }
  const std::string& checkpoint_dir() const override { return store_->checkpoint_dir(); }

  bool refuse = true;

 private:
  std::unique_ptr<TaskStore> store_;
};

TEST_F(CoordinatorCoreTest, ADeleteTheStoreRefusedLeavesTheTaskForTheNextTry) {
  auto refusing = std::make_unique<RefusingStore>(std::move(store_));
  RefusingStore* store = refusing.get();
  store_ = std::move(refusing);
  Recreate();
  ASSERT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  ASSERT_TRUE(core_->StopTask("t").ok());
  std::optional<absl::Status> done;
  ASSERT_TRUE(core_->DeleteTask("t", [&](const absl::Status& s) { done = s; }).ok());
  RunWork();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code(), absl::StatusCode::kUnavailable) << *done;
  absl::StatusOr<v1::TaskStatus> back = core_->GetTaskStatus("t");
  ASSERT_TRUE(back.ok()) << "served again, as stored";
  EXPECT_EQ(back->state(), v1::TASK_STATE_STOPPED);
  store->refuse = false;
  done.reset();
  ASSERT_TRUE(core_->DeleteTask("t", [&](const absl::Status& s) { done = s; }).ok());
  RunWork();
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << *done;
  EXPECT_EQ(store_->LoadTask("t", 10).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, EndedTasksAreDeletedOnceTheyEndedKeepEndedTasksAgo) {
  options_.keep_ended_tasks = absl::Hours(1);
  Recreate();
  // The aggregator registers again before each step: the open task never waits for one (a
  // task that waited too long would fail, and end).
  auto step_after = [&](absl::Duration d) {
    clock_.Advance(d);
    ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
    Step();
  };
  // Ended before coordinators kept the end's time: counted from the coordinator's start.
  v1::TaskStatus old;
  *old.mutable_spec() = Spec("old", 1, 5);
  old.set_state(v1::TASK_STATE_COMPLETED);
  ASSERT_TRUE(store_->PutTask(old).ok());
  Recreate();
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  ASSERT_TRUE(core_->CreateTask(Spec("open", 1, 5)).ok());
  ASSERT_TRUE(core_->StopTask("t").ok());
  step_after(absl::Minutes(30));
  ASSERT_TRUE(core_->CreateTask(Spec("later", 1, 5)).ok());
  ASSERT_TRUE(core_->StopTask("later").ok());
  step_after(absl::Minutes(29));
  for (const char* name : {"old", "t", "open", "later"}) {
    EXPECT_TRUE(core_->GetTaskStatus(name).ok()) << name << " is kept for an hour";
  }
  step_after(absl::Minutes(2));
  EXPECT_EQ(core_->GetTaskStatus("old").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->GetTaskStatus("t").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->LoadTask("t", 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->GetTaskStatus("later").ok()) << "ended half an hour after t";
  EXPECT_EQ(Deleted(registry_, "retention"), 2);
  step_after(absl::Hours(24));
  EXPECT_EQ(core_->GetTaskStatus("later").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(core_->GetTaskStatus("open").ok());
  EXPECT_EQ(Status("open").state(), v1::TASK_STATE_WAITING) << "an open task is never deleted";
  std::vector<std::string> listed;
  for (const v1::TaskStatus& s : core_->ListTasks()) listed.push_back(s.spec().name());
  EXPECT_THAT(listed, ::testing::ElementsAre("open"));
}

}  // namespace
}  // namespace shoal::coordinator
