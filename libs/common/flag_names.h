#pragma once

#include <string>
#include <vector>

namespace shoal {

// Shoal's command lines spell flags with dashes (--state-dir) while Abseil flag names use
// underscores (state_dir). Returns argv with the name part of every "--name[=value]" argument
// rewritten to underscores (values untouched; everything after a bare "--" untouched). The
// returned strings own the storage; build a char* array from them for absl::ParseCommandLine.
std::vector<std::string> DashedFlagsToAbsl(int argc, char** argv);

// Runs absl::ParseCommandLine over DashedFlagsToAbsl(argc, argv); returns the positional
// arguments (argv[0] first), like absl::ParseCommandLine.
std::vector<std::string> ParseDashedCommandLine(int argc, char** argv);

}  // namespace shoal
