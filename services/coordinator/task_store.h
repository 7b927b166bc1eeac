#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/coordinator/v1/control.pb.h"

struct sqlite3;

namespace shoal::coordinator {

// What survives a coordinator restart for one task.
struct StoredTask {
  v1::TaskStatus status;  // spec, state, round, model_version, message, created; no history
  std::vector<v1::RoundSummary> history;
};

struct StoredCheckpoint {
  std::string task;
  uint64_t version = 0;
  uint64_t round = 0;
  std::string digest;  // hex XXH3-64 of the model payload
  std::string path;    // file under <state-dir>/checkpoints, named by digest
};

// Durable coordinator state in SQLite (WAL mode) under --state-dir. Thread-safe: SQLite is
// opened in serialized mode and each method is one transaction.
class TaskStore {
 public:
  static absl::StatusOr<std::unique_ptr<TaskStore>> Open(const std::string& state_dir);
  ~TaskStore();

  absl::Status PutTask(const v1::TaskStatus& status);
  absl::Status PutRound(const std::string& task, const v1::RoundSummary& round);
  absl::Status PutCheckpoint(const StoredCheckpoint& checkpoint);
  // Every task, each with its newest `history_limit` rounds.
  absl::StatusOr<std::vector<StoredTask>> LoadTasks(size_t history_limit);
  // Up to `limit` rounds of `task` after round `after`, in order.
  absl::StatusOr<std::vector<v1::RoundSummary>> LoadRounds(const std::string& task, uint64_t after,
                                                           size_t limit);
  // Forgets the rounds of `task` after round `round` (they run again after a restore).
  absl::Status DeleteRoundsAfter(const std::string& task, uint64_t round);
  // The newest checkpoint of `task`, or exactly `version` when given. NOT_FOUND if none.
  absl::StatusOr<StoredCheckpoint> GetCheckpoint(const std::string& task,
                                                 std::optional<uint64_t> version);

  const std::string& checkpoint_dir() const { return checkpoint_dir_; }

 private:
  TaskStore(sqlite3* db, std::string checkpoint_dir);
  absl::Status Exec(const std::string& sql);

  sqlite3* db_;
  std::string checkpoint_dir_;
};

}  // namespace shoal::coordinator
