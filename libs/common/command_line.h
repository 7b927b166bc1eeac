#pragma once

#include <string>
#include <vector>

namespace shoal {

// How a binary introduces itself on --help.
struct CommandLineSpec {
  std::string program;  // e.g. "shoal-coordinator"; also the prefix of error lines
  std::string usage;    // synopsis lines without the program name, e.g. "--listen HOST:PORT ..."
  std::string summary;  // one sentence on what the binary is
  bool allow_positional = false;  // positional arguments (subcommands, files) are accepted
};

// What ParseCommandLine decided.
struct CommandLineResult {
  enum class Action { kRun, kHelp, kVersion, kUsageError };
  Action action = Action::kRun;
  std::string text;                     // help, version line or error (no program prefix)
  std::vector<std::string> positional;  // kRun: the non-flag arguments, argv[0] excluded
};

// Parses args (argv without argv[0]) into the binary's Abseil flags, without Abseil's built-in
// flags: --help / -h / --helpfull anywhere asks for help, --version for the version line. Flags
// are spelled --name=value or --name value (dashes or underscores); booleans also --name and
// --noname; everything after a bare "--" is positional. An unknown flag, a missing or bad value
// or an unexpected positional argument is kUsageError naming the flag. Sets flag values as it
// goes; call once, from main, before any thread reads a flag.
CommandLineResult ParseCommandLine(const std::vector<std::string>& args,
                                   const CommandLineSpec& spec);

// The --help text: usage lines, the summary, then every flag of this binary (Abseil's own
// flags left out) with its value placeholder, default and help, sorted by name.
std::string HelpText(const CommandLineSpec& spec);

// ParseCommandLine over argv, acting on the result: help and version go to stdout with exit
// code 0, a usage error is one line "<program>: <error>" on stderr with exit code 2. Returns the
// positional arguments when the program should run. In release builds it also turns off
// absl::Mutex deadlock detection for the process (a binary's first call).
std::vector<std::string> ParseCommandLineOrExit(int argc, char** argv, const CommandLineSpec& spec);

}  // namespace shoal
