#pragma once

// Tasks shared among the coordinators on one etcd prefix (--share-tasks). Each coordinator
// holds one lease, kept alive by its membership key (StoreLease on
// <prefix>/coordinators/<address>), and owns a task by holding <prefix>/owners/<task> under that
// lease, its value the coordinator's address. So:
// - a coordinator that dies, or is paused or cut off past its lease, loses every task at once:
//   its owner keys go with the lease, and each of its writes is fenced on the task's owner key
//   under its lease (EtcdTaskStore), so it writes nothing more;
// - a coordinator's load is its open tasks, each weighing one and one more per peer in it (the
//   peers' data reports in the task's stored status);
// - a task without an owner (stored by its creator for another coordinator, or whose owner's
//   lease lapsed) is taken by the least loaded live coordinator (the lowest address among
//   equals; by any after a second, should that one not take it): every coordinator scans the
//   prefix every `scan` and finds the same one;
// - a new task goes the same way: its creator owns it when it is the least loaded as far as it
//   knows, and otherwise stores it without an owner for the scans to place;
// - a coordinator whose load has been above another's by at least twice the weight of one of
//   its tasks for `hand_off_after` scans in a row (one that just joined, or stayed up through a
//   rolling restart), with no task waiting for an owner, hands such a task over (so the gap
//   narrows): a waiting one before a running one, the newest first. The core stops serving it
//   and releases its owner key; the scans place it.
// Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/etcd/etcd_kv.h"
#include "services/coordinator/task_placement.h"

namespace shoal::coordinator {

struct TaskOwnershipOptions {
  std::string prefix;     // the store's key prefix
  std::string advertise;  // HOST:PORT clients reach this coordinator at: its owner keys' value
  int64_t lease = 0;      // this coordinator's lease (its membership key's)
  absl::Duration scan = absl::Milliseconds(250);
  int hand_off_after = 8;  // scans of a lasting imbalance before a task is handed over
};

class TaskOwnership final : public TaskPlacement {
 public:
  TaskOwnership(etcd::EtcdKv& kv, TaskOwnershipOptions options);
  ~TaskOwnership() override;

  // The key whose holding under this coordinator's lease fences every write about `task`.
  static std::string OwnerKey(const std::string& prefix, const std::string& task);
  static std::string MemberKey(const std::string& prefix, const std::string& address);

  void Start(std::function<void(const std::string& task)> adopt,
             std::function<void(const std::string& task)> hand_off) override;
  void Stop() override;
  absl::Status Release(const std::string& task) override;
  absl::Status Elsewhere(const std::string& task) override;
  absl::StatusOr<bool> Claim(const v1::TaskStatus& initial) override;
  std::vector<v1::TaskStatus> OthersTasks() override;
  std::optional<std::string> OpenTaskFor(const std::string& join_token, bool waiting) override;
  std::map<std::string, size_t> OthersAggregatorLoad() override;

  // One scan (the thread's step; tests call it directly): reads the prefix and takes the
  // orphans this coordinator should take. Returns the tasks it took.
  absl::StatusOr<std::vector<std::string>> ScanOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // The task this coordinator should hand over, as the last scan found (see above); taken once.
  std::optional<std::string> TakeHandOff() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Owner {
    std::string address;
    int64_t lease = 0;
  };
  void ScanLoop();
  // Reads the prefix into the snapshot below; returns the tasks without an owner.
  absl::StatusOr<std::vector<std::string>> Read() ABSL_LOCKS_EXCLUDED(mu_);
  // Where the scans put `orphans` (task -> coordinator), each to the least loaded in `load`,
  // which counts them.
  std::map<std::string, std::string> Assign(const std::vector<std::string>& orphans,
                                            std::map<std::string, size_t>& load)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live coordinator with the least in `load` (by address), the lowest address among
  // equals; "" when there is none.
  static std::string LeastLoaded(const std::map<std::string, size_t>& load);
  // The load of each live coordinator (see above), as the last scan read it.
  std::map<std::string, size_t> Load() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a scan that found no orphan: counts the scans of a lasting imbalance and, at
  // hand_off_after, picks the task to hand over.
  void WeighHandOff(const std::map<std::string, size_t>& load) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the owner key if `task` has none; true when this coordinator holds it now.
  absl::StatusOr<bool> TakeOwnerKey(const std::string& task, bool task_must_be_new);

  etcd::EtcdKv& kv_;
  const TaskOwnershipOptions options_;
  std::function<void(const std::string&)> adopt_;
  std::function<void(const std::string&)> hand_off_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // What the last scan read.
  std::map<std::string, v1::TaskStatus> tasks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Owner> owners_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> members_ ABSL_GUARDED_BY(mu_);
  // How many scans in a row saw each task without an owner.
  std::map<std::string, int> orphan_scans_ ABSL_GUARDED_BY(mu_);
  int imbalanced_scans_ ABSL_GUARDED_BY(mu_) = 0;  // in a row
  std::optional<std::string> hand_off_task_ ABSL_GUARDED_BY(mu_);
  std::thread scanner_;
};

}  // namespace shoal::coordinator
