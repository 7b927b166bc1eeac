// The coordinator's store interface, one conformance suite run against each store: SQLite in a
// state directory, and etcd (a real etcd member started by the test, a key prefix per test).
// What only etcd has is in coordinator_store_etcd_test.cc.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/coordinator/task_store.h"
#include "tests/service/store_test_records.h"
#include "tests/testing/etcd_suite.h"
#include "tests/testing/temp_dir.h"

namespace shoal::coordinator {
namespace {

using store_testing::Options;
using store_testing::Round;
using store_testing::Task;
using ::testing::HasSubstr;

enum class Kind { kSqlite, kEtcd };

std::vector<uint64_t> Numbers(const std::vector<v1::RoundSummary>& rounds) {
  std::vector<uint64_t> out;
  for (const v1::RoundSummary& r : rounds) out.push_back(r.round());
  return out;
}

class StoreTest : public testing::WithEtcdMember<::testing::TestWithParam<Kind>> {
 protected:
  void SetUp() override {
    ASSERT_NE(etcd(), nullptr);
    absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-store-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    url_ = GetParam() == Kind::kSqlite
               ? "sqlite"
               : absl::StrCat("etcd://", etcd()->endpoint(), NewPrefix("test"));
    Reopen();
  }

  // A new store over the same state (a restarted coordinator).
  void Reopen() {
    store_.reset();
    absl::StatusOr<std::unique_ptr<TaskStore>> store = OpenTaskStore(Options(url_, dir_));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  std::string dir_;
  std::string url_;
  std::unique_ptr<TaskStore> store_;
};

TEST_P(StoreTest, TasksComeBackInNameOrderWithoutHistoryOrParticipants) {
  ASSERT_TRUE(store_->PutTask(Task("zeta", v1::TASK_STATE_RUNNING)).ok());
  ASSERT_TRUE(store_->PutTask(Task("alpha", v1::TASK_STATE_WAITING)).ok());
  ASSERT_TRUE(store_->PutTask(Task("alpha", v1::TASK_STATE_COMPLETED)).ok());  // replaces
  absl::StatusOr<std::vector<StoredTask>> tasks = store_->LoadTasks(10);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].status.spec().name(), "alpha");
  EXPECT_EQ((*tasks)[0].status.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_EQ((*tasks)[1].status.spec().name(), "zeta");
  EXPECT_EQ((*tasks)[1].status.spec().rounds(), 20u);
  EXPECT_EQ((*tasks)[1].status.round(), 3u);
  for (const StoredTask& t : *tasks) {
    EXPECT_EQ(t.status.history_size(), 0);
    EXPECT_EQ(t.status.participants_size(), 0);
    EXPECT_TRUE(t.history.empty());
  }
}

TEST_P(StoreTest, HistoryIsTheNewestRoundsInRoundOrder) {
  ASSERT_TRUE(store_->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());
  for (uint64_t r : {12, 3, 9, 10, 1, 2, 4, 5, 6, 7, 8, 11}) {
    ASSERT_TRUE(store_->PutRound("t", Round(r)).ok());
  }
  ASSERT_TRUE(store_->PutRound("t", Round(11, "again")).ok());  // replaces
  absl::StatusOr<std::vector<StoredTask>> tasks = store_->LoadTasks(5);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ(Numbers((*tasks)[0].history), (std::vector<uint64_t>{8, 9, 10, 11, 12}));
  EXPECT_EQ((*tasks)[0].history[3].note(), "again");
}

TEST_P(StoreTest, OneTaskLoadsAsLoadTasksGivesIt) {
  ASSERT_TRUE(store_->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());
  ASSERT_TRUE(store_->PutTask(Task("u", v1::TASK_STATE_WAITING)).ok());
  for (uint64_t r = 1; r <= 5; ++r) ASSERT_TRUE(store_->PutRound("t", Round(r)).ok());
  absl::StatusOr<StoredTask> t = store_->LoadTask("t", 3);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->status.spec().name(), "t");
  EXPECT_EQ(t->status.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(t->status.history_size(), 0);
  EXPECT_EQ(Numbers(t->history), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(store_->LoadTask("none", 3).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreTest, LoadRoundsPagesAfterARound) {
  for (uint64_t r = 1; r <= 25; ++r) ASSERT_TRUE(store_->PutRound("t", Round(r)).ok());
  absl::StatusOr<std::vector<v1::RoundSummary>> page = store_->LoadRounds("t", 9, 4);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(Numbers(*page), (std::vector<uint64_t>{10, 11, 12, 13}));
  page = store_->LoadRounds("t", 0, 100);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->size(), 25u);
  page = store_->LoadRounds("t", 25, 10);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->empty());
  page = store_->LoadRounds("unknown", 0, 10);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->empty());
}

TEST_P(StoreTest, DeleteRoundsAfterForgetsOnlyThatTasksLaterRounds) {
  // "a" is a prefix of "ab": neither task's rounds may reach the other's.
  for (uint64_t r = 1; r <= 6; ++r) {
    ASSERT_TRUE(store_->PutRound("a", Round(r)).ok());
    ASSERT_TRUE(store_->PutRound("ab", Round(r)).ok());
  }
  ASSERT_TRUE(store_->DeleteRoundsAfter("a", 4).ok());
  absl::StatusOr<std::vector<v1::RoundSummary>> a = store_->LoadRounds("a", 0, 100);
  absl::StatusOr<std::vector<v1::RoundSummary>> ab = store_->LoadRounds("ab", 0, 100);
  ASSERT_TRUE(a.ok() && ab.ok());
  EXPECT_EQ(Numbers(*a), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(ab->size(), 6u);
}

TEST_P(StoreTest, CheckpointsNewestOrExactVersion) {
  absl::StatusOr<StoredCheckpoint> none = store_->GetCheckpoint("t", std::nullopt);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("task t has no checkpoint yet"));
  for (uint64_t v : {2, 10, 9}) {
    ASSERT_TRUE(store_
                    ->PutCheckpoint({.task = "t",
                                     .version = v,
                                     .round = v + 1,
                                     .digest = absl::StrCat("d", v),
                                     .path = absl::StrCat("/ck/", v)})
                    .ok());
  }
  ASSERT_TRUE(
      store_->PutCheckpoint({.task = "tt", .version = 50, .round = 1, .digest = "", .path = ""})
          .ok());
  absl::StatusOr<StoredCheckpoint> newest = store_->GetCheckpoint("t", std::nullopt);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->version, 10u);
  EXPECT_EQ(newest->round, 11u);
  EXPECT_EQ(newest->digest, "d10");
  EXPECT_EQ(newest->path, "/ck/10");
  absl::StatusOr<StoredCheckpoint> nine = store_->GetCheckpoint("t", 9);
  ASSERT_TRUE(nine.ok()) << nine.status();
  EXPECT_EQ(nine->digest, "d9");
  absl::StatusOr<StoredCheckpoint> missing = store_->GetCheckpoint("t", 3);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no checkpoint of version 3"));
}

TEST_P(StoreTest, CheckpointsAreListedInOrderAndForgottenBeforeAVersion) {
  for (uint64_t v : {4, 1, 7, 3}) {
    ASSERT_TRUE(store_
                    ->PutCheckpoint({.task = "t",
                                     .version = v,
                                     .round = v,
                                     .digest = absl::StrCat("d", v),
                                     .path = absl::StrCat("/ck/", v)})
                    .ok());
  }
  ASSERT_TRUE(
      store_->PutCheckpoint({.task = "tt", .version = 2, .round = 2, .digest = "", .path = ""})
          .ok());
  auto versions = [&](const std::string& task) {
    absl::StatusOr<std::vector<StoredCheckpoint>> list = store_->ListCheckpoints(task);
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<uint64_t> out;
    if (list.ok()) {
      for (const StoredCheckpoint& c : *list) out.push_back(c.version);
    }
    return out;
  };
  EXPECT_EQ(versions("t"), (std::vector<uint64_t>{1, 3, 4, 7}));
  absl::StatusOr<std::vector<StoredCheckpoint>> list = store_->ListCheckpoints("t");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)[2].path, "/ck/4");
  EXPECT_EQ((*list)[2].digest, "d4");
  ASSERT_TRUE(store_->DeleteCheckpointsBefore("t", 4).ok());
  EXPECT_EQ(versions("t"), (std::vector<uint64_t>{4, 7}));
  EXPECT_EQ(versions("tt"), (std::vector<uint64_t>{2})) << "another task's are kept";
  EXPECT_TRUE(versions("none").empty());
}

TEST_P(StoreTest, AllCheckpointsComeInOneListByTaskThenVersion) {
  EXPECT_TRUE(store_->ListAllCheckpoints()->empty());
  // "t" is a prefix of "tt", and "t-2" sorts between them.
  for (const auto& [task, version] : std::vector<std::pair<std::string, uint64_t>>{
           {"tt", 2}, {"t", 7}, {"t-2", 1}, {"t", 3}, {"tt", 1}}) {
    ASSERT_TRUE(store_
                    ->PutCheckpoint({.task = task,
                                     .version = version,
                                     .round = version,
                                     .digest = absl::StrCat("d", version),
                                     .path = absl::StrCat("/ck/", task, "-", version)})
                    .ok());
  }
  absl::StatusOr<std::vector<StoredCheckpoint>> all = store_->ListAllCheckpoints();
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> got;
  for (const StoredCheckpoint& c : *all) {
    got.push_back(absl::StrCat(c.task, "/", c.version, " ", c.round, " ", c.digest, " ", c.path));
  }
  EXPECT_THAT(got,
              ::testing::ElementsAre("t/3 3 d3 /ck/t-3", "t/7 7 d7 /ck/t-7", "t-2/1 1 d1 /ck/t-2-1",
                                     "tt/1 1 d1 /ck/tt-1", "tt/2 2 d2 /ck/tt-2"));
}

TEST_P(StoreTest, EverythingSurvivesReopening) {
  ASSERT_TRUE(store_->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());
  ASSERT_TRUE(store_->PutRound("t", Round(1)).ok());
  ASSERT_TRUE(
      store_->PutCheckpoint({.task = "t", .version = 1, .round = 1, .digest = "d", .path = ""})
          .ok());
  Reopen();
  absl::StatusOr<std::vector<StoredTask>> tasks = store_->LoadTasks(10);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ(Numbers((*tasks)[0].history), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(store_->GetCheckpoint("t", 1).ok());
  EXPECT_EQ(store_->checkpoint_dir(), dir_ + "/checkpoints");
}

TEST_P(StoreTest, ADeletedTaskIsGoneWithItsRoundsAndCheckpointRecordsAndNoOtherTasks) {
  for (const char* name : {"t", "tt"}) {
    ASSERT_TRUE(store_->PutTask(Task(name, v1::TASK_STATE_COMPLETED)).ok());
    ASSERT_TRUE(store_->PutRound(name, Round(1)).ok());
    ASSERT_TRUE(
        store_->PutCheckpoint({.task = name, .version = 1, .round = 1, .digest = "d", .path = ""})
            .ok());
  }
  ASSERT_TRUE(store_->DeleteTask("t").ok());
  EXPECT_TRUE(store_->DeleteTask("t").ok()) << "a task already deleted";
  EXPECT_EQ(store_->LoadTask("t", 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->LoadRounds("t", 0, 10)->empty());
  EXPECT_TRUE(store_->ListCheckpoints("t")->empty());
  Reopen();
  absl::StatusOr<std::vector<StoredTask>> tasks = store_->LoadTasks(10);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].status.spec().name(), "tt");
  EXPECT_EQ(Numbers((*tasks)[0].history), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(store_->GetCheckpoint("tt", 1).ok());
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values(Kind::kSqlite, Kind::kEtcd),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kSqlite ? "Sqlite" : "Etcd";
                         });

TEST(OpenTaskStoreTest, MalformedStoresAreRefusedNamingTheFlag) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-store-");
  ASSERT_TRUE(dir.ok());
  for (const auto& [store, expected] : std::vector<std::pair<std::string, std::string>>{
           {"postgres://x", "expected sqlite or etcd://"},
           {"etcd://", "expected HOST:PORT for each etcd member"},
           {"etcd://127.0.0.1", "expected HOST:PORT"},
           {"etcd://127.0.0.1:2379,", "expected HOST:PORT"},
           {"etcd://127.0.0.1:2379/", "the key prefix"},
           {"etcd://127.0.0.1:2379/a b", "the key prefix"}}) {
    absl::StatusOr<std::unique_ptr<TaskStore>> opened = OpenTaskStore(Options(store, *dir));
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument) << store;
    EXPECT_THAT(opened.status().message(), HasSubstr("--store " + store)) << store;
    EXPECT_THAT(opened.status().message(), HasSubstr(expected)) << store;
  }
}

}  // namespace
}  // namespace shoal::coordinator
