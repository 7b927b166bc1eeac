#include "services/peer_agent/mode_runner.h"

#include "absl/strings/str_cat.h"
#include "libs/task/task_file.h"

namespace shoal::peer {

absl::Status CheckRunnerDeps(const ModeRunnerDeps& deps, common::v1::Mode mode, RunnerNeeds needs) {
  const std::string name = task::FriendlyEnumName(*common::v1::Mode_descriptor(), mode);
  if (deps.trainer == nullptr || deps.snapshots == nullptr || deps.metrics == nullptr ||
      deps.clock == nullptr || deps.wakeup == nullptr ||
      (needs.aggregator && deps.aggregator == nullptr) || (needs.peers && deps.peers == nullptr) ||
      (needs.send && !deps.send)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", name, " runner is missing a dependency"));
  }
  if (deps.assigned.spec().mode() != mode) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", deps.assigned.spec().name(), " is not in mode ", name));
  }
  return absl::OkStatus();
}

}  // namespace shoal::peer
