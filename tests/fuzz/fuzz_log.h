#pragma once

// Logs in the fuzz targets whose code logs as it runs. Fuzzing a corpus directory,
// coordinator_session would write about 50 MB a minute (Shoal's log lines, and protobuf's
// complaint about each invalid UTF-8 string the target puts in a message, which gRPC's parser
// would have refused), so logs are written only when the fuzzer replays input files named on its
// command line (a crash being reproduced), or when SHOAL_FUZZ_LOG=1. Either way Shoal's lines
// are still composed, so that code is fuzzed as well.

#include <google/protobuf/stubs/logging.h>
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
  if (!replaying) google::protobuf::SetLogHandler(nullptr);
}

}  // namespace shoal::fuzz
