#include "services/coordinator/store/sqlite_task_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace shoal::coordinator {
namespace {

// Owns a prepared statement for one call.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  absl::Status status() const {
    if (rc_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  void Bind(int i, const std::string& text) {
    sqlite3_bind_blob(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t value) { sqlite3_bind_int64(stmt_, i, value); }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(stmt_); }
  std::string Blob(int col) {
    const void* data = sqlite3_column_blob(stmt_, col);
    return std::string(static_cast<const char*>(data), sqlite3_column_bytes(stmt_, col));
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  absl::Status Done() {
    const int rc = Step();
    if (rc == SQLITE_DONE) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// The summaries a round query returns (its first column).
absl::StatusOr<std::vector<v1::RoundSummary>> ReadRounds(Statement& st, const std::string& task) {
  std::vector<v1::RoundSummary> rounds;
  while (st.Step() == SQLITE_ROW) {
    v1::RoundSummary round;
    if (!round.ParseFromString(st.Blob(0))) {
      return absl::DataLossError(
          absl::StrCat("sqlite: a round row of task ", task, " does not parse"));
    }
    rounds.push_back(std::move(round));
  }
  return rounds;
}

// The current row of a "SELECT version, round, digest, path FROM checkpoints".
StoredCheckpoint CheckpointRow(Statement& st, const std::string& task) {
  StoredCheckpoint c;
  c.task = task;
  c.version = static_cast<uint64_t>(st.Int(0));
  c.round = static_cast<uint64_t>(st.Int(1));
  c.digest = st.Blob(2);
  c.path = st.Blob(3);
  return c;
}

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS tasks (
  name TEXT PRIMARY KEY,
  status BLOB NOT NULL            -- serialized shoal.coordinator.v1.TaskStatus without history
);
CREATE TABLE IF NOT EXISTS rounds (
  task TEXT NOT NULL,
  round INTEGER NOT NULL,
  summary BLOB NOT NULL,          -- serialized shoal.coordinator.v1.RoundSummary
  PRIMARY KEY (task, round)
);
CREATE TABLE IF NOT EXISTS checkpoints (
  task TEXT NOT NULL,
  version INTEGER NOT NULL,
  round INTEGER NOT NULL,
  digest TEXT NOT NULL,
  path TEXT NOT NULL,
  PRIMARY KEY (task, version)
);
)sql";

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteTaskStore>> SqliteTaskStore::Open(
    const std::string& state_dir) {
  SHOAL_ASSIGN_OR_RETURN(const std::string checkpoint_dir, MakeCheckpointDir(state_dir));
  const std::string path = state_dir + "/coordinator.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir: cannot open ", path, ": ", message));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<SqliteTaskStore> store(new SqliteTaskStore(db, checkpoint_dir));
  for (const char* pragma : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=NORMAL;"}) {
    absl::Status s = store->Exec(pragma);
    if (!s.ok()) return s;
  }
  absl::Status s = store->Exec(kSchema);
  if (!s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--state-dir: ", path, ": ", s.message()));
  }
  return store;
}

SqliteTaskStore::SqliteTaskStore(sqlite3* db, std::string checkpoint_dir)
    : db_(db), checkpoint_dir_(std::move(checkpoint_dir)) {}

SqliteTaskStore::~SqliteTaskStore() { sqlite3_close(db_); }

absl::Status SqliteTaskStore::Exec(const std::string& sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", error ? error : "error"));
    sqlite3_free(error);
    return s;
  }
  return absl::OkStatus();
}

absl::Status SqliteTaskStore::PutTask(const v1::TaskStatus& status) {
  v1::TaskStatus copy = status;
  copy.clear_history();
  copy.clear_participants();
  Statement st(db_, "INSERT OR REPLACE INTO tasks (name, status) VALUES (?1, ?2)");
  if (!st.status().ok()) return st.status();
  st.Bind(1, status.spec().name());
  st.Bind(2, copy.SerializeAsString());
  return st.Done();
}

absl::Status SqliteTaskStore::PutRound(const std::string& task, const v1::RoundSummary& round) {
  Statement st(db_, "INSERT OR REPLACE INTO rounds (task, round, summary) VALUES (?1, ?2, ?3)");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task);
  st.Bind(2, static_cast<int64_t>(round.round()));
  st.Bind(3, round.SerializeAsString());
  return st.Done();
}

absl::Status SqliteTaskStore::PutCheckpoint(const StoredCheckpoint& c) {
  Statement st(db_,
               "INSERT OR REPLACE INTO checkpoints (task, version, round, digest, path) "
               "VALUES (?1, ?2, ?3, ?4, ?5)");
  if (!st.status().ok()) return st.status();
  st.Bind(1, c.task);
  st.Bind(2, static_cast<int64_t>(c.version));
  st.Bind(3, static_cast<int64_t>(c.round));
  st.Bind(4, c.digest);
  st.Bind(5, c.path);
  return st.Done();
}

absl::StatusOr<std::vector<StoredTask>> SqliteTaskStore::LoadTasks(size_t history_limit) {
  std::vector<StoredTask> tasks;
  {
    Statement st(db_, "SELECT status FROM tasks ORDER BY name");
    if (!st.status().ok()) return st.status();
    while (st.Step() == SQLITE_ROW) {
      StoredTask task;
      if (!task.status.ParseFromString(st.Blob(0))) {
        return absl::DataLossError("sqlite: a task row does not parse");
      }
      tasks.push_back(std::move(task));
    }
  }
  for (StoredTask& task : tasks) SHOAL_RETURN_IF_ERROR(LoadHistory(task, history_limit));
  return tasks;
}

absl::StatusOr<StoredTask> SqliteTaskStore::LoadTask(const std::string& name,
                                                     size_t history_limit) {
  StoredTask task;
  {
    Statement st(db_, "SELECT status FROM tasks WHERE name = ?1");
    if (!st.status().ok()) return st.status();
    st.Bind(1, name);
    if (st.Step() != SQLITE_ROW) {
      return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
    }
    if (!task.status.ParseFromString(st.Blob(0))) {
      return absl::DataLossError(absl::StrCat("sqlite: the row of task ", name, " does not parse"));
    }
  }
  SHOAL_RETURN_IF_ERROR(LoadHistory(task, history_limit));
  return task;
}

absl::Status SqliteTaskStore::LoadHistory(StoredTask& task, size_t history_limit) {
  Statement st(db_,
               "SELECT summary FROM (SELECT round, summary FROM rounds WHERE task = ?1 "
               "ORDER BY round DESC LIMIT ?2) ORDER BY round");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task.status.spec().name());
  st.Bind(2, static_cast<int64_t>(history_limit));
  SHOAL_ASSIGN_OR_RETURN(task.history, ReadRounds(st, task.status.spec().name()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::RoundSummary>> SqliteTaskStore::LoadRounds(const std::string& task,
                                                                          uint64_t after,
                                                                          size_t limit) {
  Statement st(db_,
               "SELECT summary FROM rounds WHERE task = ?1 AND round > ?2 ORDER BY round "
               "LIMIT ?3");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task);
  st.Bind(2, static_cast<int64_t>(after));
  st.Bind(3, static_cast<int64_t>(limit));
  return ReadRounds(st, task);
}

absl::Status SqliteTaskStore::DeleteRoundsAfter(const std::string& task, uint64_t round) {
  Statement st(db_, "DELETE FROM rounds WHERE task = ?1 AND round > ?2");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task);
  st.Bind(2, static_cast<int64_t>(round));
  return st.Done();
}

absl::StatusOr<StoredCheckpoint> SqliteTaskStore::GetCheckpoint(const std::string& task,
                                                                std::optional<uint64_t> version) {
  Statement st(db_, version.has_value() ? "SELECT version, round, digest, path FROM checkpoints "
                                          "WHERE task = ?1 AND version = ?2"
                                        : "SELECT version, round, digest, path FROM checkpoints "
                                          "WHERE task = ?1 ORDER BY version DESC LIMIT 1");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task);
  if (version.has_value()) st.Bind(2, static_cast<int64_t>(*version));
  if (st.Step() != SQLITE_ROW) {
    return absl::NotFoundError(
        version.has_value()
            ? absl::StrCat("task ", task, " has no checkpoint of version ", *version)
            : absl::StrCat("task ", task, " has no checkpoint yet"));
  }
  return CheckpointRow(st, task);
}

absl::StatusOr<std::vector<StoredCheckpoint>> SqliteTaskStore::ListCheckpoints(
    const std::string& task) {
  Statement st(db_,
               "SELECT version, round, digest, path FROM checkpoints WHERE task = ?1 "
               "ORDER BY version");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task);
  std::vector<StoredCheckpoint> list;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    list.push_back(CheckpointRow(st, task));
  }
  if (rc != SQLITE_DONE) {
    return absl::InternalError(
        absl::StrCat("sqlite: listing the checkpoints of task ", task, ": ", sqlite3_errstr(rc)));
  }
  return list;
}

absl::StatusOr<std::vector<StoredCheckpoint>> SqliteTaskStore::ListAllCheckpoints() {
  Statement st(db_,
               "SELECT version, round, digest, path, task FROM checkpoints ORDER BY task, "
               "version");
  if (!st.status().ok()) return st.status();
  std::vector<StoredCheckpoint> list;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    list.push_back(CheckpointRow(st, st.Blob(4)));
  }
  if (rc != SQLITE_DONE) {
    return absl::InternalError(
        absl::StrCat("sqlite: listing the checkpoints: ", sqlite3_errstr(rc)));
  }
  return list;
}

absl::Status SqliteTaskStore::DeleteCheckpointsBefore(const std::string& task, uint64_t version) {
  Statement st(db_, "DELETE FROM checkpoints WHERE task = ?1 AND version < ?2");
  if (!st.status().ok()) return st.status();
  st.Bind(1, task);
  st.Bind(2, static_cast<int64_t>(version));
  return st.Done();
}

absl::Status SqliteTaskStore::DeleteTask(const std::string& task) {
  // One statement each (the connection is shared by threads, so no transaction spans them):
  // the task's row last.
  for (const char* sql :
       {"DELETE FROM checkpoints WHERE task = ?1", "DELETE FROM rounds WHERE task = ?1",
        "DELETE FROM tasks WHERE name = ?1"}) {
    Statement st(db_, sql);
    if (!st.status().ok()) return st.status();
    st.Bind(1, task);
    SHOAL_RETURN_IF_ERROR(st.Done());
  }
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
