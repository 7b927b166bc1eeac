#pragma once

// Round updates that came before their turn in a decentralized round's fold (RoundFold), held
// until it comes: in memory up to a budget, on disk beyond it.

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/tensor/buffer_pool.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/spill_file.h"
#include "services/peer_agent/modes/decentralized/peer_update.h"

namespace shoal::peer {

// Where a fold's waiting updates wait.
struct WaitingOptions {
  // Updates wait in memory while their models take at most this many bytes together; one that
  // would take more is written to a spill file of its own and its model let go. An update whose
  // model something else holds too (a participant's own, which it serves) waits in memory
  // uncounted: writing it out would free nothing. Default: everything in memory.
  size_t memory_bytes = static_cast<size_t>(-1);
  // The spill files' directory (empty: $TMPDIR, else /tmp; tensor::SpillFile).
  std::string spill_dir;
  // Storage for an update read back from its file (null: a fresh buffer).
  std::shared_ptr<tensor::BufferPool> buffers;
};

// Not thread-safe.
class WaitingUpdates {
 public:
  explicit WaitingUpdates(WaitingOptions options) : options_(std::move(options)) {}

  bool contains(const std::string& peer_id) const { return held_.count(peer_id) > 0; }
  size_t size() const { return held_.size(); }
  // Written to disk since the last Clear.
  size_t spilled() const { return spilled_; }
  // WaitingOptions::memory_bytes from now on (what waits already stays where it is).
  void set_memory_bytes(size_t bytes) { options_.memory_bytes = bytes; }

  // Holds `update` (its model set) until Take. Errors: those of writing its spill file (the
  // directory, disk full), naming the peer; the update is not held then.
  absl::Status Put(PeerUpdate update);
  // The update of `peer_id`, no longer held (read back from its spill file, into storage from
  // `buffers`); nullopt when none is held. Errors: reading its spill file, naming the peer; the
  // update is gone then.
  absl::StatusOr<std::optional<PeerUpdate>> Take(const std::string& peer_id);
  void Clear();

 private:
  struct Held {
    PeerUpdate update;                      // its model null while spilled
    std::optional<tensor::SpillFile> file;  // the model's values, while spilled
    tensor::ModelLayout layout;             // the model's, while spilled
    size_t counted_bytes = 0;               // what it takes of memory_bytes
  };

  WaitingOptions options_;
  std::map<std::string, Held> held_;
  size_t memory_held_ = 0;
  size_t spilled_ = 0;
};

}  // namespace shoal::peer
