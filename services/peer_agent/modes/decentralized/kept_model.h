#pragma once

// The model a decentralized peer keeps on disk (shoal-peer --state-dir), so that a peer started
// again holds what it held before: in decentralized mode the peers are the only holders of a
// task's model, and a task whose holders all restarted would otherwise lose it.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "libs/tensor/flat_model.h"

namespace shoal::peer {

// One task's kept model: a model file (libs/tensor/model_file.h: written atomically, its values'
// digest checked on reading) named after the task, the run of the task (its creation time: a
// task created again under the same name in another deployment is another run) and the round,
//   <dir>/decentralized-<task>-<created_unix_ms>-round-<round>.model
// Keeping a round removes the file of the round kept before it; the first round kept also
// removes the files of other tasks but the three written last (tasks this peer left, or that
// finished while it was away). Not thread-safe (the runner's worker thread only).
class KeptModel {
 public:
  struct Held {
    uint64_t round = 0;
    tensor::FlatModel model;
  };

  // Keeps nothing when `dir` is empty or `task_created_unix_ms` is 0 (a coordinator that does
  // not say which run of the task this is).
  KeptModel(std::string dir, std::string task, int64_t task_created_unix_ms);

  bool enabled() const { return !dir_.empty(); }

  // The newest round kept for this run of the task, if one reads back whole. Files of other runs
  // of the task, older rounds and files that do not read back (with a warning naming the file
  // and what is wrong) are removed.
  std::optional<Held> Load();

  // Writes `model` as the one of `round`, then removes the file kept before (and, the first
  // time, other tasks' files but the three newest). Errors: the I/O error, naming the file (what
  // was kept before stays).
  absl::Status Keep(uint64_t round, const tensor::FlatModel& model);

  // Removes this task's files (the task is over).
  void Forget();

  // The round of the file kept on disk, if one is.
  std::optional<uint64_t> kept_round() const { return kept_round_; }

 private:
  std::string PathOf(uint64_t round) const;
  // Round of `file_name` if it is a file of this task: of this run (`this_run` true) or of
  // another (false).
  std::optional<uint64_t> RoundOf(const std::string& file_name, bool& this_run) const;
  void Remove(const std::string& path) const;
  // Removes the files of other tasks in the directory but the `count` written last.
  void RemoveOtherTasksBeyond(size_t count) const;

  const std::string dir_;
  const std::string task_;
  const std::string prefix_;  // "decentralized-TASK-": this task's files, of any run
  const int64_t created_;
  std::optional<uint64_t> kept_round_;  // the round of the file on disk, once known
  bool others_pruned_ = false;          // RemoveOtherTasksBeyond ran (once per task is enough)
};

}  // namespace shoal::peer
