#include "services/coordinator/store/checkpoint_sweep.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/tensor/model_file.h"

namespace shoal::coordinator {

absl::StatusOr<SweptFiles> SweepCheckpointDir(TaskStore& store, absl::Duration min_age,
                                              absl::Time now) {
  std::set<std::string> recorded;  // file names
  absl::StatusOr<std::vector<StoredCheckpoint>> checkpoints = store.ListAllCheckpoints();
  if (!checkpoints.ok()) return checkpoints.status();
  for (const StoredCheckpoint& c : *checkpoints) {
    recorded.insert(std::filesystem::path(c.path).filename().string());
  }
  SweptFiles swept;
  std::error_code ec;
  std::filesystem::directory_iterator it(store.checkpoint_dir(), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list ", store.checkpoint_dir(), ": ", ec.message()));
  }
  const absl::Time before = now - min_age;
  for (const std::filesystem::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    const bool unfinished = tensor::IsUnfinishedModelWrite(name);
    if (!unfinished && (!absl::EndsWith(name, ".model") || recorded.count(name) > 0)) continue;
    struct stat st;
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (absl::FromTimeT(st.st_mtime) >= before) continue;
    if (::unlink(entry.path().c_str()) != 0) {
      LogWarning("cannot delete the unused checkpoint file ", entry.path().string(), ": ",
                 std::strerror(errno));
      continue;
    }
    swept.names.push_back(name);
    swept.bytes += static_cast<uint64_t>(st.st_size);
  }
  return swept;
}

}  // namespace shoal::coordinator
