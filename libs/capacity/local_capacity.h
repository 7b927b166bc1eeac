#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "shoal/common/v1/capacity.pb.h"

namespace shoal::capacity {

// Where the cgroup and /proc files are read from (tests point it at a directory of their own).
struct SystemPaths {
  std::string cgroup = "/sys/fs/cgroup";  // cgroup v2: cpu.max, memory.max
  std::string meminfo = "/proc/meminfo";
};

// The most Capacity.aggregator_rtts a node measures and the coordinator takes
// (SessionService.ListAggregators gives 32).
inline constexpr size_t kMaxAggregatorRtts = 64;

// Usable cores: the scheduler affinity mask, capped by a cgroup v2 quota (cpu.max, rounded up).
uint32_t UsableCores(const SystemPaths& paths = {});
// Physical memory, capped by a cgroup v2 limit (memory.max); and what is available now
// (MemAvailable, capped by the limit minus memory.current).
uint64_t MemoryBytes(const SystemPaths& paths = {});
uint64_t AvailableMemoryBytes(const SystemPaths& paths = {});

// The matrix-multiply score: single-threaded float GFLOP/s of an n x n product, the best of
// `runs` runs. n = 192, 5 runs take about 5-40 ms on today's machines.
double MatmulGflops(int n = 192, int runs = 5);

// Cores, the matrix-multiply score and memory (no upload, no reachability).
common::v1::Capacity MeasureLocalCapacity(const SystemPaths& paths = {});

// "4 cores, 3.1 GFLOP/s, 15.6 GiB (12.0 GiB free), upload 1.2 GB/s, reachable": for logs and
// shoalctl.
std::string Describe(const common::v1::Capacity& capacity);

}  // namespace shoal::capacity
