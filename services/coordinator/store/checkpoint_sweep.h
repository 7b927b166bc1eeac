#pragma once

// Removing the files of a coordinator's checkpoint directory that nothing needs any more: model
// files whose checkpoint records are gone (their task was deleted by another coordinator while
// this one was down, a prune could not unlink one) and unfinished writes a crash left behind.
// The coordinator runs it once when it starts, beside serving.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/task_store.h"

namespace shoal::coordinator {

// The files in use are at most this old: a checkpoint's file is written and recorded within its
// transfer's deadline (AggregatorWorkOptions::transfer_timeout, 5 minutes).
inline constexpr absl::Duration kSweepMinAge = absl::Hours(1);

struct SweptFiles {
  std::vector<std::string> names;  // the files deleted, by name
  uint64_t bytes = 0;
};

// Deletes, in `store.checkpoint_dir()`, each regular file last changed before `now - min_age`
// that is an unfinished model write (tensor::IsUnfinishedModelWrite) or a `.model` file that no
// checkpoint record of the store names. Records are matched by file name, not by path, so that a
// directory shared by coordinators that mount it at different paths keeps what any of them
// recorded (a record whose task's status is gone still keeps its file). Other files stay. Fails,
// deleting nothing, when the store cannot list its checkpoints (one read,
// TaskStore::ListAllCheckpoints); a file that cannot be deleted is logged and left.
absl::StatusOr<SweptFiles> SweepCheckpointDir(TaskStore& store, absl::Duration min_age,
                                              absl::Time now);

}  // namespace shoal::coordinator
