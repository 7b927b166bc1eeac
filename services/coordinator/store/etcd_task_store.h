#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "libs/etcd/etcd_kv.h"
#include "services/coordinator/store/store_lease.h"
#include "services/coordinator/store/task_ownership.h"
#include "services/coordinator/task_store.h"

namespace shoal::coordinator {

// The coordinator's state in etcd, under one key prefix:
//   <prefix>/tasks/<task>                       TaskStatus (without history and participants)
//   <prefix>/rounds/<task>/<round, 20 digits>   RoundSummary
//   <prefix>/checkpoints/<task>/<version, 20 digits>   CheckpointRecord (store.proto)
//   <prefix>/owner                              the coordinator that holds the prefix
//   <prefix>/coordinators/<address>, <prefix>/owners/<task>   with shared tasks (below)
// Numbers are zero-padded so that etcd's key order is their order. The checkpoints' model files
// stay in `checkpoint_dir` on this machine. Every write is fenced (StoreLease): on the hold on
// the prefix, or with shared tasks (--share-tasks, store/task_ownership.h) on the task's owner
// key under this coordinator's lease. A store that lost it writes nothing (FAILED_PRECONDITION).
// Thread-safe.
class EtcdTaskStore final : public TaskStore {
 public:
  // Waits for the hold on `prefix` (StoreLease::Acquire) and keeps it until destroyed. With a
  // non-empty `shared_as` (this coordinator's address) it shares the prefix's tasks with the
  // other coordinators instead: the hold is on its membership key, and placement() says which
  // tasks it serves.
  static absl::StatusOr<std::unique_ptr<EtcdTaskStore>> Open(std::unique_ptr<etcd::EtcdKv> kv,
                                                             std::string prefix,
                                                             std::string checkpoint_dir,
                                                             StoreLeaseOptions lease,
                                                             std::string shared_as = "");

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
  TaskPlacement* placement() override { return ownership_.get(); }

 private:
  EtcdTaskStore(std::unique_ptr<etcd::EtcdKv> kv, std::string prefix, std::string checkpoint_dir);
  // "<prefix>/<kind>/" and, with a task, "<prefix>/<kind>/<task>/".
  std::string KindPrefix(absl::string_view kind) const;
  std::string TaskPrefix(absl::string_view kind, absl::string_view task) const;
  // The checkpoint records under `prefix` (every task's, or one task's), each with the task
  // its key names, in key order.
  absl::StatusOr<std::vector<StoredCheckpoint>> RangeCheckpoints(const std::string& prefix);
  absl::StatusOr<std::vector<v1::RoundSummary>> ReadRounds(const std::string& task,
                                                           const etcd::RangeQuery& query);
  // The task's status record parsed, with its newest `history_limit` rounds.
  absl::StatusOr<StoredTask> ParseTask(const etcd::KeyValue& kv, size_t history_limit);
  // What fences the writes about `task`.
  etcd::Fence FenceFor(const std::string& task) const;

  std::unique_ptr<etcd::EtcdKv> kv_;
  std::string prefix_;
  std::string checkpoint_dir_;
  std::unique_ptr<StoreLease> lease_;         // declared after kv_: released before kv_ goes
  std::unique_ptr<TaskOwnership> ownership_;  // with shared tasks; stopped before lease_ goes
};

}  // namespace shoal::coordinator
