#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/common/direct_writer.h"
#include "libs/common/fd.h"
#include "libs/tensor/flat_model.h"

struct XXH3_state_s;

namespace shoal::tensor {

// Model files: a small header (magic "SHOALMDL", format version, layout, value digest) followed
// by the raw little-endian float32 values. Used for checkpoints and `model get --out FILE`.
//
// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of the directory.
// Errors: INTERNAL / the errno mapping on I/O failures, with the path in the message.
absl::Status WriteModelFile(const std::string& path, const FlatModel& model);

// Whether `file_name` (a name in a directory, without its path) is a temporary file that a
// write of a model file cut short (a crash) left behind: WriteModelFile's "NAME.tmp.PID" or a
// ModelFileWriter's ".model-XXXXXX". Such a file is never read; whoever owns the directory may
// remove it once no write of its own is under way.
bool IsUnfinishedModelWrite(absl::string_view file_name);

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

// The byte offset of the values in a model file of `layout` (the header's size).
uint64_t ModelFileValuesOffset(const ModelLayout& layout);

// Writes a model file from values that arrive in order, e.g. a streamed download, without a
// model-sized buffer: the values go straight to a temporary file in `dir` (their digest computed
// on the way), and Commit() writes the header and moves the file into place atomically (fsync,
// rename, fsync of the directory), as WriteModelFile does. The values are written at
// `values_offset`: given the right one (ModelFileValuesOffset of the layout, e.g. from an earlier
// file of the same model), they are where they stay and Commit() writes just the header;
// otherwise Commit() copies them behind the header inside the kernel (copy_file_range). Values
// written where they stay go around the page cache where the file system allows (DirectWriter):
// a checkpoint written every round then costs its writer one copy of the model, not three.
// Values to be copied (`values_offset` 0: the layout unknown until the last one, as in a
// download to a new file) go through the page cache, which the copy then reads.
// The file gets the mode WriteModelFile's gets (0644 less the umask). Destroying an
// uncommitted writer removes its temporary file. Not thread-safe.
class ModelFileWriter {
 public:
  // Errors: the errno mapping when the temporary file cannot be made, naming it.
  static absl::StatusOr<std::unique_ptr<ModelFileWriter>> Create(const std::string& dir,
                                                                 uint64_t values_offset = 0);
  ~ModelFileWriter();
  ModelFileWriter(const ModelFileWriter&) = delete;
  ModelFileWriter& operator=(const ModelFileWriter&) = delete;

  // Values [first, first + values.size()); `first` must be the count written so far
  // (FAILED_PRECONDITION otherwise). A tensor::WriteValues target.
  absl::Status Write(size_t first, absl::Span<const float> values);
  // The digest of the values written so far: FlatModel::Digest() once they are all in.
  uint64_t digest() const;
  // Writes the file of `layout` (whose values must all have been written: INVALID_ARGUMENT
  // otherwise) as `path`, which should be in the same file system as `dir`.
  absl::Status Commit(const ModelLayout& layout, const std::string& path);

 private:
  ModelFileWriter() = default;

  std::string tmp_;  // the temporary file, removed unless committed
  Fd fd_;
  std::unique_ptr<DirectWriter> values_;  // into fd_, from values_offset_
  uint64_t values_offset_ = 0;
  size_t written_ = 0;  // values
  XXH3_state_s* digest_ = nullptr;
  bool committed_ = false;
};

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
