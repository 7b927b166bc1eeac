#pragma once

#include <string_view>

#include "absl/strings/str_cat.h"

namespace shoal {

enum class LogLevel { kInfo, kWarning, kError };

// Sets the name printed on every log line (the binary, e.g. "shoal-peer"). Call once in main().
void SetLogProgramName(std::string_view name);

// Writes one line to stderr: "2026-11-21T21:40:00.123Z I shoal-peer: message". Thread-safe.
void Log(LogLevel level, std::string_view message);

// Stops (false) or resumes (true, the default) writing log lines; callers still compose them.
// For the fuzz targets that drive a service core, which would otherwise log gigabytes an hour.
void SetLogOutputEnabled(bool enabled);

template <typename... Args>
void LogInfo(const Args&... args) {
  Log(LogLevel::kInfo, absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  Log(LogLevel::kWarning, absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  Log(LogLevel::kError, absl::StrCat(args...));
}

}  // namespace shoal
