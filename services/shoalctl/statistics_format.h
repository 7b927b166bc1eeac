#pragma once

// TaskStatus.statistics, the federation's statistics of a task whose peers standardise with
// them (normalization standardize without the task's mean/std), for `task status`.

#include <string>

#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::shoalctl {

// As JSON: {"mean":[...],"std":[...],"samples":N,"peers":[...],"fixed_unix_ms":N}, or "null"
// before they are fixed and for tasks without them.
std::string StatisticsToJson(const coordinator::v1::TaskStatus& status);
// The "statistics:" lines of FormatTaskStatus (the first 8 features' mean and std); "" without.
std::string FormatStatisticsLine(const coordinator::v1::TaskStatus& status);

}  // namespace shoal::shoalctl
