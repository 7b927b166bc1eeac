#include "libs/common/address_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shoal {

absl::Status WriteAddressFile(const std::string& path,
                              const std::map<std::string, std::string>& addresses) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("cannot write address file ", tmp));
    for (const auto& [key, value] : addresses) out << key << "=" << value << "\n";
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write address file ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> ReadAddressFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no address file ", path));
  std::map<std::string, std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

}  // namespace shoal
