#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "services/coordinator/task_store.h"

struct sqlite3;

namespace shoal::coordinator {

// The coordinator's state in SQLite (WAL mode), in <state-dir>/coordinator.db; checkpoints under
// <state-dir>/checkpoints. Thread-safe: SQLite is opened in serialized mode and each method is
// one transaction.
class SqliteTaskStore final : public TaskStore {
 public:
  // Errors: FAILED_PRECONDITION naming --state-dir when the directory or the database cannot be
  // created or opened.
  static absl::StatusOr<std::unique_ptr<SqliteTaskStore>> Open(const std::string& state_dir);
  ~SqliteTaskStore() override;

  absl::Status PutTask(const v1::TaskStatus& status) override;
  absl::Status PutRound(const std::string& task, const v1::RoundSummary& round) override;
  absl::Status PutCheckpoint(const StoredCheckpoint& checkpoint) override;
  absl::StatusOr<std::vector<StoredTask>> LoadTasks(size_t history_limit) override;
  absl::StatusOr<StoredTask> LoadTask(const std::string& task, size_t history_limit) override;
  absl::StatusOr<std::vector<v1::RoundSummary>> LoadRounds(const std::string& task, uint64_t after,
                                                           size_t limit) override;
  absl::Status DeleteRoundsAfter(const std::string& task, uint64_t round) override;
  absl::StatusOr<StoredCheckpoint> GetCheckpoint(const std::string& task,
                                                 std::optional<uint64_t> version) override;
  absl::StatusOr<std::vector<StoredCheckpoint>> ListCheckpoints(const std::string& task) override;
  absl::StatusOr<std::vector<StoredCheckpoint>> ListAllCheckpoints() override;
  absl::Status DeleteCheckpointsBefore(const std::string& task, uint64_t version) override;
  absl::Status DeleteTask(const std::string& task) override;
  const std::string& checkpoint_dir() const override { return checkpoint_dir_; }

 private:
  SqliteTaskStore(sqlite3* db, std::string checkpoint_dir);
  absl::Status Exec(const std::string& sql);
  // Reads the newest `history_limit` rounds of `task`'s status into its history.
  absl::Status LoadHistory(StoredTask& task, size_t history_limit);

  sqlite3* db_;
  std::string checkpoint_dir_;
};

}  // namespace shoal::coordinator
