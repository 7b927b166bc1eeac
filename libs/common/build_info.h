#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace shoal {

// What this binary was built from: the CMake project version and the source commit, recorded at
// build time by cmake/BuildInfo.cmake. Constant data; thread-safe.
struct BuildInfo {
  absl::string_view version;  // e.g. "0.1.0"
  absl::string_view commit;   // short git sha, or "unknown" when built without git
  bool modified = false;      // tracked files differed from the commit at build time
};

const BuildInfo& GetBuildInfo();

// "<program> <version> (commit <sha>[, modified])": what every binary's --version prints.
std::string VersionLine(absl::string_view program);

}  // namespace shoal
