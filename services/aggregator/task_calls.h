#pragma once

// TaskCalls: which tasks the coordinator set up on this aggregator, and in what order, so that a
// registration can name the tasks held and its answer free only those not set up again since.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace shoal::aggregator {

class TaskCalls {
 public:
  // The tasks called about, and the number of the latest call (RegisterAggregatorRequest.tasks).
  struct Held {
    std::vector<std::string> names;
    uint64_t as_of = 0;
  };

  // Numbers a call that sets `task` up (PutModel, OpenRound, OpenBuffer, SetMembers, Watch),
  // made before the call's work; waits while a Forget runs.
  void Record(const std::string& task) ABSL_LOCKS_EXCLUDED(mu_);
  Held Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `forget` and drops the task's calls, with Record waiting meanwhile.
  void Forget(const std::string& task, absl::FunctionRef<void()> forget) ABSL_LOCKS_EXCLUDED(mu_);
  // Forget, unless `task` was called about after `as_of` (a Held::as_of) or never: whether it
  // forgot it.
  bool ForgetUnlessCalledSince(const std::string& task, uint64_t as_of,
                               absl::FunctionRef<void()> forget) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> last_ ABSL_GUARDED_BY(mu_);
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::aggregator
