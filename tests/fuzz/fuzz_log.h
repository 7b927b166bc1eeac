#pragma once

// Shoal's own log lines in the fuzz targets that drive a service core. Fuzzing a corpus directory,
// coordinator_session would log about 3 GB an hour, so lines are written only when the fuzzer
// replays input files named on its command line (a crash being reproduced), or when
// SHOAL_FUZZ_LOG=1. Either way every line is still composed, so that code is fuzzed as well.

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include "libs/common/log.h"

namespace shoal::fuzz {

inline void LogOnlyWhenReplaying(int argc, char** argv) {
  const char* forced = std::getenv("SHOAL_FUZZ_LOG");
  bool replaying = forced != nullptr && std::strcmp(forced, "1") == 0;
  for (int i = 1; i < argc && !replaying; ++i) {
    struct stat info;
    replaying = argv[i][0] != '-' && stat(argv[i], &info) == 0 && S_ISREG(info.st_mode);
  }
  SetLogOutputEnabled(replaying);
}

}  // namespace shoal::fuzz
