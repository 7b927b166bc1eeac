#pragma once

// Float values kept on disk instead of in memory: a peer's copy of the global model while LibTorch
// holds the parameters, gradients and momentum (services/peer_agent/modes/aggregator_peer.h).

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/common/fd.h"

namespace shoal::tensor {

// An unnamed file (O_TMPFILE, or a file unlinked as soon as it is made where the file system
// lacks O_TMPFILE) in a directory: nothing to clean up, it goes when the SpillFile is destroyed
// or the process dies. Keep the directory on disk: on a tmpfs the values would still
// be in memory, only outside this process. Not thread-safe, except that the const calls (reads,
// positioned) may run on several threads at once.
class SpillFile {
 public:
  // In `dir`; empty: $TMPDIR, else /tmp. Errors: INVALID_ARGUMENT / NOT_FOUND /
  // PERMISSION_DENIED (from errno) naming the directory when it cannot hold an unnamed file.
  static absl::StatusOr<SpillFile> Create(const std::string& dir);

  // Replaces the stored values. Errors (disk full, ...) name the directory; the values held
  // before are gone then (size() is 0).
  absl::Status Write(absl::Span<const float> values);
  // Makes the file hold `size` zeros, to be filled in by WriteAt (e.g. as a download arrives).
  absl::Status Reset(size_t size);
  // Stores values [first, first + values.size()), within size().
  absl::Status WriteAt(size_t first, absl::Span<const float> values);
  size_t size() const { return size_; }
  // Reads every stored value into `out` (out.size() == size()).
  absl::Status Read(absl::Span<float> out) const;
  // Reads values [first, first + out.size()), within size().
  absl::Status ReadAt(size_t first, absl::Span<float> out) const;
  // values[i] -= stored[i] for every i, a chunk at a time (values.size() == size()).
  absl::Status SubtractFrom(absl::Span<float> values) const;

 private:
  SpillFile(Fd fd, std::string dir) : fd_(std::move(fd)), dir_(std::move(dir)) {}
  absl::Status CheckRange(size_t first, size_t n) const;

  Fd fd_;
  std::string dir_;
  size_t size_ = 0;
};

}  // namespace shoal::tensor
