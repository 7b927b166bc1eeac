#include "libs/common/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/build_info.h"

namespace shoal {
namespace {

constexpr size_t kHelpColumns = 100;
constexpr absl::string_view kHelpIndent = "      ";

// Abseil registers its own flags (--flagfile, --fromenv, --helpmatch, ...); they are neither
// listed nor accepted, since nothing here implements them.
bool IsAbseilFlag(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/flags/");
}

absl::CommandLineFlag* FindOwnFlag(absl::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || flag->IsRetired() || IsAbseilFlag(*flag)) return nullptr;
  return flag;
}

std::string Dashed(absl::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

std::string Underscored(absl::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

bool IsHelpFlag(absl::string_view name) {
  return name == "help" || name == "h" || name == "helpfull" || name == "helpshort" || name == "?";
}

// The value placeholder shown after a flag: the one the usage synopsis uses ("--listen
// HOST:PORT"), else one named after the flag's type.
std::string Placeholder(const absl::CommandLineFlag& flag, const std::string& usage) {
  if (flag.IsOfType<bool>()) return "";
  const std::string needle = absl::StrCat("--", Dashed(flag.Name()), " ");
  if (size_t at = usage.find(needle); at != std::string::npos) {
    const size_t start = at + needle.size();
    const size_t end = std::min(usage.find_first_of(" ])\n", start), usage.size());
    const std::string word = usage.substr(start, end - start);
    if (!word.empty() && word[0] != '-' && word[0] != '(' && word[0] != '[') return word;
  }
  if (flag.IsOfType<absl::Duration>()) return "DURATION";
  if (flag.IsOfType<int>() || flag.IsOfType<int64_t>() || flag.IsOfType<uint32_t>() ||
      flag.IsOfType<uint64_t>()) {
    return "N";
  }
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "X";
  return "VALUE";
}

// Appends text word-wrapped to kHelpColumns, every line indented.
void AppendWrapped(std::string& out, absl::string_view text) {
  std::string line(kHelpIndent);
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > kHelpIndent.size() && line.size() + 1 + word.size() > kHelpColumns) {
      absl::StrAppend(&out, line, "\n");
      line = std::string(kHelpIndent);
    }
    if (line.size() > kHelpIndent.size()) line += ' ';
    absl::StrAppend(&line, word);
  }
  absl::StrAppend(&out, line, "\n");
}

CommandLineResult UsageError(std::string text) {
  CommandLineResult result;
  result.action = CommandLineResult::Action::kUsageError;
  result.text = std::move(text);
  return result;
}

}  // namespace

std::string HelpText(const CommandLineSpec& spec) {
  std::string out;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(spec.usage, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, first ? "Usage: " : "   or: ", spec.program, " ", line, "\n");
    first = false;
  }
  if (!spec.summary.empty()) absl::StrAppend(&out, "\n", spec.summary, "\n");

  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsAbseilFlag(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  absl::StrAppend(&out, "\nFlags (--name VALUE or --name=VALUE; dashes or underscores):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&out, "  --", Dashed(flag->Name()));
    if (std::string value = Placeholder(*flag, spec.usage); !value.empty()) {
      absl::StrAppend(&out, " ", value);
    }
    const std::string def = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) {
      if (!def.empty()) absl::StrAppend(&out, "  (default: \"", def, "\")");
    } else {
      absl::StrAppend(&out, "  (default: ", def, ")");
    }
    absl::StrAppend(&out, "\n");
    AppendWrapped(out, flag->Help());
  }
  absl::StrAppend(&out, "  --help\n", kHelpIndent, "print this help and exit\n");
  absl::StrAppend(&out, "  --version\n", kHelpIndent,
                  "print the version and source commit and exit\n");
  return out;
}

CommandLineResult ParseCommandLine(const std::vector<std::string>& args,
                                   const CommandLineSpec& spec) {
  // --help and --version win over everything else on the line, even over a bad flag.
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const std::string name = Underscored(body.substr(0, body.find('=')));
    if (IsHelpFlag(name)) return {CommandLineResult::Action::kHelp, HelpText(spec), {}};
    if (name == "version") {
      return {CommandLineResult::Action::kVersion, VersionLine(spec.program), {}};
    }
  }

  CommandLineResult result;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      result.positional.insert(result.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      result.positional.push_back(arg);
      continue;
    }
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = Underscored(body.substr(0, eq));
    const bool has_value = eq != std::string::npos;
    std::string value = has_value ? body.substr(eq + 1) : "";

    absl::CommandLineFlag* flag = FindOwnFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      // --noinsecure
      absl::CommandLineFlag* negated = FindOwnFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        value = "false";
      }
    } else if (flag != nullptr && flag->IsOfType<bool>() && !has_value) {
      value = "true";
    } else if (flag != nullptr && !has_value) {
      if (i + 1 >= args.size()) {
        return UsageError(absl::StrCat("--", Dashed(name), " needs a value"));
      }
      value = args[++i];
    }
    if (flag == nullptr) {
      return UsageError(absl::StrCat("unknown flag --", Dashed(name), " (", spec.program,
                                     " --help lists the flags)"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return UsageError(absl::StrCat("bad value \"", value, "\" for --", Dashed(name),
                                     error.empty() ? "" : ": ", error));
    }
  }
  if (!spec.allow_positional && !result.positional.empty()) {
    return UsageError(absl::StrCat("unexpected argument \"", result.positional[0], "\""));
  }
  return result;
}

std::vector<std::string> ParseCommandLineOrExit(int argc, char** argv,
                                                const CommandLineSpec& spec) {
#ifdef NDEBUG
  // Debian's Abseil is built with absl::Mutex deadlock detection on: every lock of a mutex
  // then searches a graph of all mutexes ever held together. A coordinator with 10,000 peer
  // sessions spent 8% of its CPU in it. Tests keep it on (they do not call this).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  CommandLineResult result =
      ParseCommandLine(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc), spec);
  switch (result.action) {
    case CommandLineResult::Action::kRun:
      return std::move(result.positional);
    case CommandLineResult::Action::kHelp:
    case CommandLineResult::Action::kVersion:
      std::fputs(result.text.c_str(), stdout);
      if (result.action == CommandLineResult::Action::kVersion) std::fputs("\n", stdout);
      std::fflush(stdout);
      std::exit(0);
    case CommandLineResult::Action::kUsageError:
      std::fprintf(stderr, "%s: %s\n", spec.program.c_str(), result.text.c_str());
      std::exit(2);
  }
  return {};
}

}  // namespace shoal
