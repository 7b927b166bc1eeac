#include "services/peer_agent/modes/decentralized/kept_model.h"

#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/log.h"
#include "libs/tensor/model_file.h"

namespace shoal::peer {
namespace {

constexpr absl::string_view kSuffix = ".model";
// The other tasks' files kept besides this task's: a peer that comes back to one of the tasks it
// left last still holds its model; older ones go.
constexpr size_t kOtherTasksKept = 3;

}  // namespace

KeptModel::KeptModel(std::string dir, std::string task, int64_t task_created_unix_ms)
    : dir_(task_created_unix_ms > 0 ? std::move(dir) : std::string()),
      task_(std::move(task)),
      prefix_(absl::StrCat("decentralized-", task_, "-")),
      created_(task_created_unix_ms) {}

std::string KeptModel::PathOf(uint64_t round) const {
  return absl::StrCat(dir_, "/", prefix_, created_, "-round-", round, kSuffix);
}

std::optional<uint64_t> KeptModel::RoundOf(const std::string& file_name, bool& this_run) const {
  absl::string_view rest = file_name;
  if (!absl::ConsumePrefix(&rest, prefix_) || !absl::ConsumeSuffix(&rest, kSuffix)) {
    return std::nullopt;
  }
  // "<created>-round-<round>"; another task whose name starts with this one's has more parts.
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, '-');
  int64_t created = 0;
  uint64_t round = 0;
  if (parts.size() != 3 || parts[1] != "round" || !absl::SimpleAtoi(parts[0], &created) ||
      !absl::SimpleAtoi(parts[2], &round)) {
    return std::nullopt;
  }
  this_run = created == created_;
  return round;
}

void KeptModel::Remove(const std::string& path) const {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) LogWarning("task ", task_, ": cannot remove ", path, ": ", ec.message());
}

std::optional<KeptModel::Held> KeptModel::Load() {
  if (!enabled()) return std::nullopt;
  std::error_code ec;
  std::vector<std::pair<uint64_t, std::string>> kept;  // this run's files
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix_) && tensor::IsUnfinishedModelWrite(name)) {
      Remove(entry.path().string());  // a write cut short by a crash
      continue;
    }
    bool this_run = false;
    const std::optional<uint64_t> round = RoundOf(name, this_run);
    if (!round.has_value()) continue;
    if (this_run) {
      kept.emplace_back(*round, entry.path().string());
    } else {
      LogInfo("task ", task_, ": removing ", entry.path().string(),
              ", kept for another run of a task of this name");
      Remove(entry.path().string());
    }
  }
  if (ec) {
    LogWarning("task ", task_, ": cannot read the state directory ", dir_, ": ", ec.message());
    return std::nullopt;
  }
  std::sort(kept.rbegin(), kept.rend());  // newest round first
  std::optional<Held> held;
  for (const auto& [round, path] : kept) {
    if (held.has_value()) {
      Remove(path);
      continue;
    }
    absl::StatusOr<tensor::FlatModel> model = tensor::ReadModelFile(path);
    if (!model.ok()) {
      LogWarning("task ", task_, ": the model kept for round ", round,
                 " does not read back; removing it: ", model.status().message());
      Remove(path);
      continue;
    }
    held = Held{round, *std::move(model)};
    kept_round_ = round;
  }
  return held;
}

absl::Status KeptModel::Keep(uint64_t round, const tensor::FlatModel& model) {
  if (!enabled()) return absl::OkStatus();
  if (absl::Status s = tensor::WriteModelFile(PathOf(round), model); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("keeping the model of round ", round, " in ", dir_,
                                               ": ", s.message()));
  }
  if (kept_round_.has_value() && *kept_round_ != round) Remove(PathOf(*kept_round_));
  kept_round_ = round;
  if (!others_pruned_) {
    RemoveOtherTasksBeyond(kOtherTasksKept);
    others_pruned_ = true;
  }
  return absl::OkStatus();
}

void KeptModel::RemoveOtherTasksBeyond(size_t count) const {
  // The files of tasks this peer left (for another task, or it was away when they finished),
  // newest first.
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> others;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    bool this_run = false;
    if (!absl::StartsWith(name, "decentralized-") || !absl::EndsWith(name, kSuffix) ||
        RoundOf(name, this_run).has_value()) {
      continue;
    }
    std::error_code time_ec;
    others.emplace_back(entry.last_write_time(time_ec), entry.path().string());
  }
  std::sort(others.rbegin(), others.rend());
  for (size_t i = count; i < others.size(); ++i) {
    LogInfo("task ", task_, ": removing ", others[i].second, ", kept for a task left before the ",
            count, " newest");
    Remove(others[i].second);
  }
}

void KeptModel::Forget() {
  if (!enabled()) return;
  if (kept_round_.has_value()) Remove(PathOf(*kept_round_));
  kept_round_.reset();
}

}  // namespace shoal::peer
