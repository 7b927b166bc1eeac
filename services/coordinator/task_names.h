#pragma once

#include <string>

#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

// Display names (bounded metric labels, log lines): "federated-sync" for MODE_FEDERATED_SYNC,
// "running" for TASK_STATE_RUNNING.
std::string ModeName(common::v1::Mode mode);
const char* StateName(v1::TaskState state);

}  // namespace shoal::coordinator
