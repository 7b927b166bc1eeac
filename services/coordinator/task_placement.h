#pragma once

// Where tasks are served when several coordinators share one etcd prefix (--share-tasks): each
// task has one owner among them, and the others send its callers there. The core asks this
// interface about the tasks it does not hold; store/task_ownership.h implements it on etcd.
// A coordinator that serves every task has none (a null TaskPlacement*).

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

class TaskPlacement {
 public:
  virtual ~TaskPlacement() = default;

  // Starts taking tasks that have no owner (those of a coordinator that died, or one that was
  // stored without one): each one taken is handed to `adopt`, on the placement's thread. And
  // starts evening out the load (open tasks, each weighing one and one per peer in it): while
  // this coordinator's load exceeds another's by twice a task's weight or more, one such task at
  // a time is handed to `hand_off` (on the same thread), which stops serving it and then calls
  // Release, for the least loaded to take it.
  virtual void Start(std::function<void(const std::string& task)> adopt,
                     std::function<void(const std::string& task)> hand_off) = 0;
  // Stops taking tasks; neither callback is called after it returns. Idempotent.
  virtual void Stop() = 0;
  // Gives up this coordinator's hold on `task` (once it has stopped serving it and every write
  // about it is done), so that the scans give it to the least loaded coordinator. OK when it
  // held none.
  virtual absl::Status Release(const std::string& task) = 0;

  // What to answer about `task`, which this coordinator does not hold: UNAVAILABLE naming the
  // coordinator that serves it (or saying it is being taken over), so that a client given
  // every coordinator's address moves on; NOT_FOUND when no coordinator has a task of the name.
  virtual absl::Status Elsewhere(const std::string& task) = 0;
  // A task to be created, `initial` its first status: true when this coordinator is the least
  // loaded (as it last read the loads) and is the task's owner now; false when the task was
  // stored without an owner instead, for the coordinators' scans to give it to the least
  // loaded. UNAVAILABLE naming the owner when another coordinator has a task of
  // that name.
  virtual absl::StatusOr<bool> Claim(const v1::TaskStatus& initial) = 0;
  // The tasks other coordinators serve (or none does yet), as they last stored them, without
  // history or join token, oldest first.
  virtual std::vector<v1::TaskStatus> OthersTasks() = 0;
  // The address of another coordinator serving an open task that a peer with `join_token` may
  // join (`waiting`: one waiting for peers), if one does.
  virtual std::optional<std::string> OpenTaskFor(const std::string& join_token, bool waiting) = 0;
  // The aggregators other coordinators' open tasks use, as they last stored them: address ->
  // tasks (each task counted once per aggregator: its own, its clusters', their backups'). A
  // coordinator adds its own tasks' and gives a new task the least used aggregator.
  virtual std::map<std::string, size_t> OthersAggregatorLoad() = 0;
};

}  // namespace shoal::coordinator
