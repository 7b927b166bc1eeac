#include "libs/tensor/spill_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::tensor {
namespace {

constexpr size_t kChunkFloats = size_t{1} << 18;  // 1 MiB

absl::Status FileError(int error, const std::string& dir, const char* what) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat("spill file in ", dir, ": ", what, ": ", std::strerror(error)));
}

}  // namespace

absl::StatusOr<SpillFile> SpillFile::Create(const std::string& where) {
  std::error_code ec;
  const std::string dir = where.empty() ? std::filesystem::temp_directory_path(ec).string() : where;
  if (ec) return absl::InvalidArgumentError(absl::StrCat("no usable TMPDIR: ", ec.message()));
  Fd fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid() && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // A file system without O_TMPFILE (overlayfs before Linux 6.6): a named file, unlinked at
    // once.
    std::string path = dir + "/.shoal-spill-XXXXXX";
    fd = Fd(::mkostemp(path.data(), O_CLOEXEC));
    if (fd.valid()) ::unlink(path.c_str());
  }
  if (!fd.valid()) return FileError(errno, dir, "cannot create an unnamed file");
  return SpillFile(std::move(fd), dir);
}

absl::Status SpillFile::Reset(size_t size) {
  size_ = 0;
  if (::ftruncate(fd_.get(), 0) != 0 ||
      ::ftruncate(fd_.get(), static_cast<off_t>(size * sizeof(float))) != 0) {
    return FileError(errno, dir_, "truncate");
  }
  size_ = size;
  return absl::OkStatus();
}

absl::Status SpillFile::Write(absl::Span<const float> values) {
  if (absl::Status s = Reset(values.size()); !s.ok()) return s;
  if (absl::Status s = WriteAt(0, values); !s.ok()) {
    size_ = 0;
    return s;
  }
  return absl::OkStatus();
}

absl::Status SpillFile::CheckRange(size_t first, size_t n) const {
  if (first > size_ || n > size_ - first) {
    return absl::OutOfRangeError(absl::StrCat("spill file holds ", size_, " values, asked for [",
                                              first, ", ", first + n, ")"));
  }
  return absl::OkStatus();
}

absl::Status SpillFile::WriteAt(size_t first, absl::Span<const float> values) {
  if (absl::Status s = CheckRange(first, values.size()); !s.ok()) return s;
  if (const int err = WriteFull(fd_.get(), values.data(), values.size() * sizeof(float),
                                static_cast<int64_t>(first * sizeof(float)));
      err != 0) {
    return FileError(err, dir_, "write");
  }
  return absl::OkStatus();
}

absl::Status SpillFile::ReadAt(size_t first, absl::Span<float> out) const {
  if (absl::Status s = CheckRange(first, out.size()); !s.ok()) return s;
  const int err = ReadFull(fd_.get(), out.data(), out.size() * sizeof(float),
                           static_cast<int64_t>(first * sizeof(float)));
  if (err == kEndOfFile) {
    return absl::DataLossError(absl::StrCat("spill file in ", dir_, ": truncated"));
  }
  if (err != 0) return FileError(err, dir_, "read");
  return absl::OkStatus();
}

absl::Status SpillFile::Read(absl::Span<float> out) const {
  if (out.size() != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("spill file holds ", size_, " values, asked for ", out.size()));
  }
  return ReadAt(0, out);
}

absl::Status SpillFile::SubtractFrom(absl::Span<float> values) const {
  if (values.size() != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("spill file holds ", size_, " values, subtracting from ", values.size()));
  }
  std::vector<float> chunk(std::min(kChunkFloats, size_));
  for (size_t first = 0; first < size_; first += chunk.size()) {
    const size_t n = std::min(chunk.size(), size_ - first);
    absl::Status s = ReadAt(first, absl::MakeSpan(chunk.data(), n));
    if (!s.ok()) return s;
    float* v = values.data() + first;
    for (size_t i = 0; i < n; ++i) v[i] -= chunk[i];
  }
  return absl::OkStatus();
}

}  // namespace shoal::tensor
