// SweepCheckpointDir on the real SQLite store: what a coordinator deletes from its checkpoint
// directory at start-up, and what it leaves.

#include "services/coordinator/store/checkpoint_sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/time.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "tests/testing/temp_dir.h"

namespace shoal::coordinator {
namespace {

using ::testing::UnorderedElementsAre;

// A file of `bytes` bytes last changed `age` ago.
void MakeFile(const std::string& path, size_t bytes, absl::Duration age) {
  std::ofstream(path) << std::string(bytes, 'x');
  const absl::Time then = absl::Now() - age;
  const timeval times[2] = {absl::ToTimeval(then), absl::ToTimeval(then)};
  ASSERT_EQ(::utimes(path.c_str(), times), 0) << path;
}

TEST(CheckpointSweepTest, DeletesOnlyOldFilesNoRecordNamesAndOldUnfinishedWrites) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("checkpoint-sweep");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<SqliteTaskStore>> store = SqliteTaskStore::Open(*dir);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string ckpt = (*store)->checkpoint_dir();
  v1::TaskStatus status;
  status.mutable_spec()->set_name("t");
  ASSERT_TRUE((*store)->PutTask(status).ok());
  // The task's record names its file by another path (the same volume mounted elsewhere by the
  // coordinator that wrote it): the name is what counts.
  StoredCheckpoint kept{"t", 3, 3, "00000000000000aa",
                        "/elsewhere/checkpoints/t-00000000000000aa.model"};
  ASSERT_TRUE((*store)->PutCheckpoint(kept).ok());

  const absl::Duration old = 2 * kSweepMinAge;
  MakeFile(ckpt + "/t-00000000000000aa.model", 10, old);               // recorded
  MakeFile(ckpt + "/t-00000000000000bb.model", 1000, old);             // pruned, unlink failed
  MakeFile(ckpt + "/gone-00000000000000cc.model", 2000, old);          // a task deleted meanwhile
  MakeFile(ckpt + "/t-00000000000000dd.model", 10, absl::Minutes(1));  // its record may follow
  MakeFile(ckpt + "/.model-Ab12Cd", 300, old);                         // a crash mid-write
  MakeFile(ckpt + "/.model-Xy34Zw", 10, absl::Minutes(1));             // a write going on
  MakeFile(ckpt + "/notes.txt", 10, old);                              // not a model file
  std::filesystem::create_directory(ckpt + "/old.model");              // not a regular file

  absl::StatusOr<SweptFiles> swept = SweepCheckpointDir(**store, kSweepMinAge, absl::Now());
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_THAT(swept->names, UnorderedElementsAre("t-00000000000000bb.model",
                                                 "gone-00000000000000cc.model", ".model-Ab12Cd"));
  EXPECT_EQ(swept->bytes, 3300u);
  std::set<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(ckpt)) {
    left.insert(entry.path().filename().string());
  }
  EXPECT_THAT(left, UnorderedElementsAre("t-00000000000000aa.model", "t-00000000000000dd.model",
                                         ".model-Xy34Zw", "notes.txt", "old.model"));

  // Again: nothing more to delete.
  swept = SweepCheckpointDir(**store, kSweepMinAge, absl::Now());
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_TRUE(swept->names.empty());
}

}  // namespace
}  // namespace shoal::coordinator
