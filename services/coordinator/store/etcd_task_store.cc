#include "services/coordinator/store/etcd_task_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "libs/common/status_macros.h"
#include "shoal/coordinator/v1/store.pb.h"

namespace shoal::coordinator {
namespace {

// 20 digits hold every uint64, so the keys sort as the numbers do.
std::string Padded(uint64_t n) { return absl::StrFormat("%020u", n); }

absl::StatusOr<StoredCheckpoint> ParseCheckpoint(const std::string& task,
                                                 const etcd::KeyValue& kv) {
  v1::CheckpointRecord record;
  if (!record.ParseFromString(kv.value) || record.task() != task) {
    return absl::DataLossError(
        absl::StrCat("etcd: the checkpoint record ", kv.key, " does not parse"));
  }
  StoredCheckpoint c;
  c.task = task;
  c.version = record.version();
  c.round = record.round();
  c.digest = record.digest();
  c.path = record.path();
  return c;
}

}  // namespace

EtcdTaskStore::EtcdTaskStore(std::unique_ptr<etcd::EtcdKv> kv, std::string prefix,
                             std::string checkpoint_dir)
    : kv_(std::move(kv)), prefix_(std::move(prefix)), checkpoint_dir_(std::move(checkpoint_dir)) {}

absl::StatusOr<std::unique_ptr<EtcdTaskStore>> EtcdTaskStore::Open(std::unique_ptr<etcd::EtcdKv> kv,
                                                                   std::string prefix,
                                                                   std::string checkpoint_dir,
                                                                   StoreLeaseOptions lease,
                                                                   std::string shared_as) {
  std::unique_ptr<EtcdTaskStore> store(
      new EtcdTaskStore(std::move(kv), std::move(prefix), std::move(checkpoint_dir)));
  const std::string key = shared_as.empty() ? store->prefix_ + "/owner"
                                            : TaskOwnership::MemberKey(store->prefix_, shared_as);
  if (!shared_as.empty()) {
    lease.conflict = absl::StrCat(
        "another coordinator on this prefix has the same address (each one needs a host or "
        "--listen port of its own)");
  }
  absl::StatusOr<std::unique_ptr<StoreLease>> held =
      StoreLease::Acquire(*store->kv_, key, std::move(lease));
  if (!held.ok()) return held.status();
  store->lease_ = *std::move(held);
  if (!shared_as.empty()) {
    store->ownership_ = std::make_unique<TaskOwnership>(
        *store->kv_, TaskOwnershipOptions{store->prefix_, shared_as, store->lease_->fence().lease});
  }
  return store;
}

etcd::Fence EtcdTaskStore::FenceFor(const std::string& task) const {
  if (ownership_ == nullptr) return lease_->fence();
  return {TaskOwnership::OwnerKey(prefix_, task), lease_->fence().lease};
}

std::string EtcdTaskStore::KindPrefix(absl::string_view kind) const {
  return absl::StrCat(prefix_, "/", kind, "/");
}

std::string EtcdTaskStore::TaskPrefix(absl::string_view kind, absl::string_view task) const {
  return absl::StrCat(prefix_, "/", kind, "/", task, "/");
}

absl::Status EtcdTaskStore::PutTask(const v1::TaskStatus& status) {
  v1::TaskStatus copy = status;
  copy.clear_history();
  copy.clear_participants();
  const etcd::Fence fence = FenceFor(status.spec().name());
  return kv_->Put(KindPrefix("tasks") + status.spec().name(), copy.SerializeAsString(), &fence);
}

absl::Status EtcdTaskStore::PutRound(const std::string& task, const v1::RoundSummary& round) {
  const etcd::Fence fence = FenceFor(task);
  return kv_->Put(TaskPrefix("rounds", task) + Padded(round.round()), round.SerializeAsString(),
                  &fence);
}

absl::Status EtcdTaskStore::PutCheckpoint(const StoredCheckpoint& c) {
  v1::CheckpointRecord record;
  record.set_task(c.task);
  record.set_version(c.version);
  record.set_round(c.round);
  record.set_digest(c.digest);
  record.set_path(c.path);
  const etcd::Fence fence = FenceFor(c.task);
  return kv_->Put(TaskPrefix("checkpoints", c.task) + Padded(c.version), record.SerializeAsString(),
                  &fence);
}

absl::StatusOr<std::vector<v1::RoundSummary>> EtcdTaskStore::ReadRounds(
    const std::string& task, const etcd::RangeQuery& query) {
  absl::StatusOr<std::vector<etcd::KeyValue>> kvs = kv_->Range(query);
  if (!kvs.ok()) return kvs.status();
  std::vector<v1::RoundSummary> rounds;
  rounds.reserve(kvs->size());
  for (const etcd::KeyValue& kv : *kvs) {
    v1::RoundSummary round;
    if (!round.ParseFromString(kv.value)) {
      return absl::DataLossError(
          absl::StrCat("etcd: the round record ", kv.key, " of task ", task, " does not parse"));
    }
    rounds.push_back(std::move(round));
  }
  if (query.descending) std::reverse(rounds.begin(), rounds.end());
  return rounds;
}

absl::StatusOr<std::vector<StoredTask>> EtcdTaskStore::LoadTasks(size_t history_limit) {
  const std::string tasks_prefix = KindPrefix("tasks");
  absl::StatusOr<std::vector<etcd::KeyValue>> kvs =
      kv_->Range({tasks_prefix, etcd::EtcdKv::PrefixEnd(tasks_prefix)});
  if (!kvs.ok()) return kvs.status();
  std::vector<StoredTask> tasks;
  tasks.reserve(kvs->size());
  for (const etcd::KeyValue& kv : *kvs) {
    SHOAL_ASSIGN_OR_RETURN(StoredTask task, ParseTask(kv, history_limit));
    tasks.push_back(std::move(task));
  }
  return tasks;
}

absl::StatusOr<StoredTask> EtcdTaskStore::LoadTask(const std::string& name, size_t history_limit) {
  const std::string key = KindPrefix("tasks") + name;
  absl::StatusOr<std::vector<etcd::KeyValue>> kvs = kv_->Range({key, key + '\0'});
  if (!kvs.ok()) return kvs.status();
  if (kvs->empty()) return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
  return ParseTask(kvs->front(), history_limit);
}

absl::StatusOr<StoredTask> EtcdTaskStore::ParseTask(const etcd::KeyValue& kv,
                                                    size_t history_limit) {
  StoredTask task;
  if (!task.status.ParseFromString(kv.value)) {
    return absl::DataLossError(absl::StrCat("etcd: the task record ", kv.key, " does not parse"));
  }
  if (history_limit > 0) {
    const std::string rounds = TaskPrefix("rounds", task.status.spec().name());
    absl::StatusOr<std::vector<v1::RoundSummary>> history = ReadRounds(
        task.status.spec().name(), {rounds, etcd::EtcdKv::PrefixEnd(rounds),
                                    static_cast<int64_t>(history_limit), /*descending=*/true});
    if (!history.ok()) return history.status();
    task.history = *std::move(history);
  }
  return task;
}

absl::StatusOr<std::vector<v1::RoundSummary>> EtcdTaskStore::LoadRounds(const std::string& task,
                                                                        uint64_t after,
                                                                        size_t limit) {
  if (limit == 0 || after == UINT64_MAX) return std::vector<v1::RoundSummary>{};
  const std::string rounds = TaskPrefix("rounds", task);
  return ReadRounds(task, {rounds + Padded(after + 1), etcd::EtcdKv::PrefixEnd(rounds),
                           static_cast<int64_t>(limit)});
}

absl::Status EtcdTaskStore::DeleteRoundsAfter(const std::string& task, uint64_t round) {
  if (round == UINT64_MAX) return absl::OkStatus();
  const std::string rounds = TaskPrefix("rounds", task);
  const etcd::Fence fence = FenceFor(task);
  return kv_->DeleteRange(rounds + Padded(round + 1), etcd::EtcdKv::PrefixEnd(rounds), &fence);
}

absl::StatusOr<StoredCheckpoint> EtcdTaskStore::GetCheckpoint(const std::string& task,
                                                              std::optional<uint64_t> version) {
  const std::string checkpoints = TaskPrefix("checkpoints", task);
  etcd::RangeQuery query{checkpoints, etcd::EtcdKv::PrefixEnd(checkpoints), 1, true};
  if (version.has_value()) {
    query.start = checkpoints + Padded(*version);
    query.end = query.start + '\0';  // exactly that key
    query.descending = false;
  }
  absl::StatusOr<std::vector<etcd::KeyValue>> kvs = kv_->Range(query);
  if (!kvs.ok()) return kvs.status();
  if (kvs->empty()) {
    return absl::NotFoundError(
        version.has_value()
            ? absl::StrCat("task ", task, " has no checkpoint of version ", *version)
            : absl::StrCat("task ", task, " has no checkpoint yet"));
  }
  return ParseCheckpoint(task, kvs->front());
}

absl::StatusOr<std::vector<StoredCheckpoint>> EtcdTaskStore::ListCheckpoints(
    const std::string& task) {
  return RangeCheckpoints(TaskPrefix("checkpoints", task));
}

absl::StatusOr<std::vector<StoredCheckpoint>> EtcdTaskStore::ListAllCheckpoints() {
  absl::StatusOr<std::vector<StoredCheckpoint>> list = RangeCheckpoints(KindPrefix("checkpoints"));
  if (!list.ok()) return list.status();
  // Key order puts "t-2/" before "t/" ('-' sorts before '/'): order by name as SQLite does.
  std::stable_sort(
      list->begin(), list->end(),
      [](const StoredCheckpoint& a, const StoredCheckpoint& b) { return a.task < b.task; });
  return list;
}

absl::StatusOr<std::vector<StoredCheckpoint>> EtcdTaskStore::RangeCheckpoints(
    const std::string& prefix) {
  const std::string kind = KindPrefix("checkpoints");
  absl::StatusOr<std::vector<etcd::KeyValue>> kvs =
      kv_->Range({prefix, etcd::EtcdKv::PrefixEnd(prefix), 0, false});
  if (!kvs.ok()) return kvs.status();
  std::vector<StoredCheckpoint> list;
  list.reserve(kvs->size());
  for (const etcd::KeyValue& kv : *kvs) {
    // PREFIX/checkpoints/TASK/VERSION: task names hold no '/'.
    const absl::string_view rest = absl::string_view(kv.key).substr(kind.size());
    SHOAL_ASSIGN_OR_RETURN(StoredCheckpoint c,
                           ParseCheckpoint(std::string(rest.substr(0, rest.find('/'))), kv));
    list.push_back(std::move(c));
  }
  return list;
}

absl::Status EtcdTaskStore::DeleteCheckpointsBefore(const std::string& task, uint64_t version) {
  const std::string checkpoints = TaskPrefix("checkpoints", task);
  const etcd::Fence fence = FenceFor(task);
  return kv_->DeleteRange(checkpoints, checkpoints + Padded(version), &fence);
}

absl::Status EtcdTaskStore::DeleteTask(const std::string& task) {
  const std::string status = KindPrefix("tasks") + task;
  const std::string rounds = TaskPrefix("rounds", task);
  const std::string checkpoints = TaskPrefix("checkpoints", task);
  return kv_->DeleteRanges({{status, status + '\0'},
                            {rounds, etcd::EtcdKv::PrefixEnd(rounds)},
                            {checkpoints, etcd::EtcdKv::PrefixEnd(checkpoints)}},
                           FenceFor(task));
}

}  // namespace shoal::coordinator
