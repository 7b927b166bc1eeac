#pragma once

// What the coordinator persists, behind one interface: SQLite under --state-dir (the default,
// store/sqlite_task_store.h) or etcd (`--store etcd://...`, store/etcd_task_store.h). Both pass
// the same conformance suite (tests/service/coordinator_store_test.cc).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace shoal::coordinator {

class TaskPlacement;

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
  std::string path;    // file under checkpoint_dir(), named by digest
};

// Durable coordinator state. Thread-safe; each method is atomic on its own.
class TaskStore {
 public:
  virtual ~TaskStore() = default;

  // Stores the task's status without its history and participants (they have their own
  // records), replacing what was stored under the task's name.
  virtual absl::Status PutTask(const v1::TaskStatus& status) = 0;
  virtual absl::Status PutRound(const std::string& task, const v1::RoundSummary& round) = 0;
  virtual absl::Status PutCheckpoint(const StoredCheckpoint& checkpoint) = 0;
  // Every task in name order, each with its newest `history_limit` rounds in round order.
  virtual absl::StatusOr<std::vector<StoredTask>> LoadTasks(size_t history_limit) = 0;
  // One task as LoadTasks gives it. NOT_FOUND if there is none of that name.
  virtual absl::StatusOr<StoredTask> LoadTask(const std::string& task, size_t history_limit) = 0;
  // Up to `limit` rounds of `task` after round `after`, in order.
  virtual absl::StatusOr<std::vector<v1::RoundSummary>> LoadRounds(const std::string& task,
                                                                   uint64_t after,
                                                                   size_t limit) = 0;
  // Forgets the rounds of `task` after round `round` (they run again after a restore).
  virtual absl::Status DeleteRoundsAfter(const std::string& task, uint64_t round) = 0;
  // The newest checkpoint of `task`, or exactly `version` when given. NOT_FOUND if none.
  virtual absl::StatusOr<StoredCheckpoint> GetCheckpoint(const std::string& task,
                                                         std::optional<uint64_t> version) = 0;
  // Every checkpoint record of `task`, oldest version first.
  virtual absl::StatusOr<std::vector<StoredCheckpoint>> ListCheckpoints(
      const std::string& task) = 0;
  // Every checkpoint record of every task in one read: by task name, then oldest version first.
  virtual absl::StatusOr<std::vector<StoredCheckpoint>> ListAllCheckpoints() = 0;
  // Forgets the checkpoint records of `task` older than `version` (not their files).
  virtual absl::Status DeleteCheckpointsBefore(const std::string& task, uint64_t version) = 0;

  // Forgets `task`: its status, rounds and checkpoint records (not the checkpoints' files; list
  // them first). OK when there is no such task. A delete cut short leaves a task that can be
  // deleted again (its status record goes last, or with the rest at once).
  virtual absl::Status DeleteTask(const std::string& task) = 0;

  // Where the checkpoints' model files live (a directory of this machine).
  virtual const std::string& checkpoint_dir() const = 0;
  // Which coordinator serves which task, when coordinators share the store's tasks
  // (--share-tasks); null when this coordinator serves every task in the store.
  virtual TaskPlacement* placement() { return nullptr; }
};

// Creates `state_dir`/checkpoints if needed and returns it. FAILED_PRECONDITION naming
// --state-dir when it cannot be created.
absl::StatusOr<std::string> MakeCheckpointDir(const std::string& state_dir);

struct StoreOptions {
  // "" or "sqlite" (SQLite in state_dir), or "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" (etcd's
  // members; keys under /PREFIX, by default /shoal).
  std::string store = "sqlite";
  std::string state_dir;  // checkpoint files go under state_dir/checkpoints either way
  // etcd only: the TTL of the coordinator's hold on its prefix (store/store_lease.h), and what
  // to do when the hold is lost (the store writes nothing more from then on).
  absl::Duration lease_ttl = absl::Seconds(10);
  std::function<void(const absl::Status&)> on_lost;
  // etcd only: the address clients reach this coordinator at, written in the prefix's owner
  // key for the standbys to name.
  std::string advertise;
  // etcd only: while another coordinator holds the prefix, wait as its standby for as long as
  // it does (true), or give up after a TTL and a half (false, FAILED_PRECONDITION naming it).
  bool standby = false;
  // etcd only: called with the owner key's value whenever another holder is seen.
  std::function<void(const std::string& holder)> on_held;
  // etcd only: when notified, OpenTaskStore stops waiting for the prefix (CANCELLED).
  const absl::Notification* stop = nullptr;
  // etcd only: share the prefix's tasks with the other coordinators on it, each task served by
  // one (store/task_ownership.h), instead of holding the whole prefix. Needs `advertise`.
  bool share_tasks = false;
  // etcd only: mutual TLS to its members (--store-tls: the coordinator's certificate and CA);
  // null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
};

// Whether `store` names etcd (etcd://...).
bool IsEtcdStore(const std::string& store);

// Opens the store `options` name. Errors name the flag: INVALID_ARGUMENT for a malformed
// --store, FAILED_PRECONDITION for a state directory that cannot be used, a build without etcd
// or a prefix another coordinator holds, UNAVAILABLE when no etcd member answers, CANCELLED
// when `stop` ended the wait for the prefix.
absl::StatusOr<std::unique_ptr<TaskStore>> OpenTaskStore(const StoreOptions& options);

}  // namespace shoal::coordinator
