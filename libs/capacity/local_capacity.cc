#include "libs/capacity/local_capacity.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shoal::capacity {
namespace {

// The first line of a small file, trimmed; nullopt when it cannot be read.
std::optional<std::string> FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(line));
}

// A cgroup v2 byte count ("max" = no limit).
std::optional<uint64_t> CgroupBytes(const std::string& path) {
  std::optional<std::string> line = FirstLine(path);
  uint64_t value = 0;
  if (!line || *line == "max" || !absl::SimpleAtoi(*line, &value)) return std::nullopt;
  return value;
}

// A field of /proc/meminfo in bytes ("MemAvailable:   123456 kB").
std::optional<uint64_t> MeminfoBytes(const std::string& path, absl::string_view field) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    uint64_t kib = 0;
    if (parts.size() >= 2 && absl::StripSuffix(parts[0], ":") == field &&
        absl::SimpleAtoi(parts[1], &kib)) {
      return kib * 1024;
    }
  }
  return std::nullopt;
}

std::string Bytes(double bytes) {
  if (bytes >= 1 << 30) return absl::StrFormat("%.1f GiB", bytes / (1 << 30));
  return absl::StrFormat("%.0f MiB", bytes / (1 << 20));
}

}  // namespace

uint32_t UsableCores(const SystemPaths& paths) {
  uint32_t cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores == 0) cores = static_cast<uint32_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  // cpu.max: "<quota> <period>" or "max <period>".
  if (std::optional<std::string> line = FirstLine(paths.cgroup + "/cpu.max")) {
    std::vector<std::string> parts = absl::StrSplit(*line, ' ', absl::SkipEmpty());
    double quota = 0, period = 0;
    if (parts.size() == 2 && absl::SimpleAtod(parts[0], &quota) &&
        absl::SimpleAtod(parts[1], &period) && quota > 0 && period > 0) {
      cores = std::min(cores, static_cast<uint32_t>(std::max(1.0, std::ceil(quota / period))));
    }
  }
  return cores;
}

uint64_t MemoryBytes(const SystemPaths& paths) {
  uint64_t bytes = MeminfoBytes(paths.meminfo, "MemTotal").value_or(0);
  if (std::optional<uint64_t> limit = CgroupBytes(paths.cgroup + "/memory.max")) {
    bytes = bytes == 0 ? *limit : std::min(bytes, *limit);
  }
  return bytes;
}

uint64_t AvailableMemoryBytes(const SystemPaths& paths) {
  uint64_t bytes = MeminfoBytes(paths.meminfo, "MemAvailable").value_or(0);
  std::optional<uint64_t> limit = CgroupBytes(paths.cgroup + "/memory.max");
  std::optional<uint64_t> used = CgroupBytes(paths.cgroup + "/memory.current");
  if (limit) {
    const uint64_t room = *limit - std::min(*limit, used.value_or(0));
    bytes = bytes == 0 ? room : std::min(bytes, room);
  }
  return bytes;
}

double MatmulGflops(int n, int runs) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f;
    b[i] = static_cast<float>(i % 5) * 0.5f;
  }
  double best = 0;
  volatile float sink = 0;
  for (int run = 0; run < runs; ++run) {
    std::fill(c.begin(), c.end(), 0.0f);
    const auto start = std::chrono::steady_clock::now();
    // i-k-j order: the inner loop runs along rows of b and c (vectorisable, cache friendly).
    for (int i = 0; i < n; ++i) {
      float* ci = &c[static_cast<size_t>(i) * n];
      for (int k = 0; k < n; ++k) {
        const float aik = a[static_cast<size_t>(i) * n + k];
        const float* bk = &b[static_cast<size_t>(k) * n];
        for (int j = 0; j < n; ++j) ci[j] += aik * bk[j];
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sink = sink + c[static_cast<size_t>(run) % c.size()];  // keeps the product alive
    if (seconds > 0) best = std::max(best, 2.0 * n * n * n / seconds / 1e9);
  }
  return best;
}

common::v1::Capacity MeasureLocalCapacity(const SystemPaths& paths) {
  common::v1::Capacity capacity;
  capacity.set_cpu_cores(UsableCores(paths));
  capacity.set_matmul_gflops(MatmulGflops());
  capacity.set_memory_bytes(MemoryBytes(paths));
  capacity.set_memory_available_bytes(AvailableMemoryBytes(paths));
  return capacity;
}

std::string Describe(const common::v1::Capacity& c) {
  std::string out = absl::StrFormat("%u cores, %.1f GFLOP/s, %s (%s free)", c.cpu_cores(),
                                    c.matmul_gflops(), Bytes(static_cast<double>(c.memory_bytes())),
                                    Bytes(static_cast<double>(c.memory_available_bytes())));
  if (c.upload_bytes_per_second() > 0) {
    absl::StrAppendFormat(&out, ", upload %.0f MB/s", c.upload_bytes_per_second() / 1e6);
  }
  const common::v1::AggregatorRtt* nearest = nullptr;
  for (const common::v1::AggregatorRtt& rtt : c.aggregator_rtts()) {
    if (nearest == nullptr || rtt.rtt_us() < nearest->rtt_us()) nearest = &rtt;
  }
  if (nearest != nullptr) {
    absl::StrAppendFormat(&out, ", nearest aggregator %s (%.2f ms of %d measured)",
                          nearest->address(), nearest->rtt_us() / 1e3, c.aggregator_rtts_size());
  }
  if (c.reachability() == common::v1::REACHABILITY_REACHABLE) absl::StrAppend(&out, ", reachable");
  if (c.reachability() == common::v1::REACHABILITY_UNREACHABLE) {
    absl::StrAppend(&out, ", unreachable");
  }
  return out;
}

}  // namespace shoal::capacity
