#pragma once

// Figures of a running process from /proc, and percentiles, for the benchmarks.

#include <sys/types.h>

#include <string>
#include <vector>

namespace shoal::bench {

// A /proc/PID/status field in KiB ("VmRSS", "VmHWM") as MiB; -1 when absent.
double StatusMiB(pid_t pid, const std::string& field);
inline double RssMiB(pid_t pid) { return StatusMiB(pid, "VmRSS"); }
// CPU seconds (user + system) the process has used so far, from /proc/PID/stat.
double CpuSeconds(pid_t pid);
// The 1-minute load average; -1 when unknown.
double LoadAverage();
// The value at fraction p (0..1) of the sorted values; 0 for none.
double Percentile(std::vector<double> v, double p);

}  // namespace shoal::bench
