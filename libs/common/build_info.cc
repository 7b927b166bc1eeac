#include "libs/common/build_info.h"

#include "absl/strings/str_cat.h"
#include "shoal_build_info_values.h"

namespace shoal {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info{SHOAL_BUILD_VERSION, SHOAL_BUILD_COMMIT, SHOAL_BUILD_MODIFIED != 0};
  return info;
}

std::string VersionLine(absl::string_view program) {
  const BuildInfo& info = GetBuildInfo();
  return absl::StrCat(program, " ", info.version, " (commit ", info.commit,
                      info.modified ? ", modified" : "", ")");
}

}  // namespace shoal
