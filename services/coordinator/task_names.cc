#include "services/coordinator/task_names.h"

#include "libs/task/task_file.h"

namespace shoal::coordinator {

// The name task files write (a mode's ModeDefinition::name).
std::string ModeName(common::v1::Mode mode) {
  return task::FriendlyEnumName(*common::v1::Mode_descriptor(), mode);
}

const char* StateName(v1::TaskState state) {
  switch (state) {
    case v1::TASK_STATE_WAITING:
      return "waiting";
    case v1::TASK_STATE_RUNNING:
      return "running";
    case v1::TASK_STATE_COMPLETED:
      return "completed";
    case v1::TASK_STATE_STOPPED:
      return "stopped";
    case v1::TASK_STATE_FAILED:
      return "failed";
    default:
      return "unspecified";
  }
}

}  // namespace shoal::coordinator
