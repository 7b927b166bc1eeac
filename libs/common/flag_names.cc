#include "libs/common/flag_names.h"

#include <algorithm>

#include "absl/flags/parse.h"

namespace shoal {

std::vector<std::string> DashedFlagsToAbsl(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& arg = out[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg[0] != '-') continue;
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + static_cast<long>(start), arg.begin() + static_cast<long>(end), '-',
                 '_');
  }
  return out;
}

std::vector<std::string> ParseDashedCommandLine(int argc, char** argv) {
  std::vector<std::string> args = DashedFlagsToAbsl(argc, argv);
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return std::vector<std::string>(rest.begin(), rest.end());
}

}  // namespace shoal
