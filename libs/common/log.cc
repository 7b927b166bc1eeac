#include "libs/common/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal {
namespace {

absl::Mutex log_mu(absl::kConstInit);
std::string* program_name ABSL_GUARDED_BY(log_mu) = nullptr;
std::atomic<bool> output_enabled{true};

}  // namespace

void SetLogProgramName(std::string_view name) {
  absl::MutexLock lock(&log_mu);
  delete program_name;
  program_name = new std::string(name);
}

void SetLogOutputEnabled(bool enabled) { output_enabled.store(enabled, std::memory_order_relaxed); }

void Log(LogLevel level, std::string_view message) {
  if (!output_enabled.load(std::memory_order_relaxed)) return;
  const char tag = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  const std::string now =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  absl::MutexLock lock(&log_mu);
  std::fprintf(stderr, "%s %c %s: %.*s\n", now.c_str(), tag,
               program_name ? program_name->c_str() : "shoal", static_cast<int>(message.size()),
               message.data());
  std::fflush(stderr);
}

}  // namespace shoal
