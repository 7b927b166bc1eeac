#include "services/coordinator/task_names.h"

#include <algorithm>

#include "absl/strings/ascii.h"

namespace shoal::coordinator {

std::string ModeName(common::v1::Mode mode) {
  const std::string& full = common::v1::Mode_Name(mode);  // MODE_FEDERATED_SYNC
  std::string name = absl::AsciiStrToLower(full.size() > 5 ? full.substr(5) : full);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
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
