#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/flat_model.h"

namespace shoal::tensor {

// Model files: a small header (magic "SHOALMDL", format version, layout, value digest) followed
// by the raw little-endian float32 values. Used for checkpoints and `model get --out FILE`.
//
// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of the directory.
// Errors: INTERNAL / the errno mapping on I/O failures, with the path in the message.
absl::Status WriteModelFile(const std::string& path, const FlatModel& model);

// Writes the same bytes to an open descriptor (a pipe: `model get --out -`); `what` names it in
// errors. Not atomic: on error the reader gets a truncated file, which ReadModelFile rejects.
absl::Status WriteModel(int fd, const FlatModel& model, const std::string& what);

// Reads and verifies a model file (magic, version, layout sanity, exact size, header checksum
// and value digest). Errors: NOT_FOUND missing file; DATA_LOSS corrupt or truncated file;
// INVALID_ARGUMENT not a model file / unsupported format version.
absl::StatusOr<FlatModel> ReadModelFile(const std::string& path);

// Same checks for a model file open as `fd` (a regular file positioned at its start; its size
// comes from fstat); `what` names it in errors.
absl::StatusOr<FlatModel> ReadModel(int fd, const std::string& what);

// A model file mapped read-only, for serving it without a model-sized buffer in the heap
// (ControlService.GetModel): Open makes ReadModelFile's checks, the value digest included (one
// pass over the mapped values), and the values stay the file's pages in the page cache.
// Immutable and thread-safe; unmapped when the last reference goes.
class MappedModelFile {
 public:
  // Errors: as ReadModelFile.
  static absl::StatusOr<std::shared_ptr<const MappedModelFile>> Open(const std::string& path);
  ~MappedModelFile();
  MappedModelFile(const MappedModelFile&) = delete;
  MappedModelFile& operator=(const MappedModelFile&) = delete;

  const ModelLayout& layout() const { return layout_; }
  // Tensor t's values as stored: little-endian float32 bytes.
  absl::string_view TensorBytes(size_t t) const;

 private:
  MappedModelFile() = default;

  ModelLayout layout_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const char* values_ = nullptr;  // inside the mapping
};

}  // namespace shoal::tensor
