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

absl::Status SpillFile::Write(absl::Span<const float> values) {
  size_ = 0;
  if (::ftruncate(fd_.get(), 0) != 0) return FileError(errno, dir_, "truncate");
  const char* p = reinterpret_cast<const char*>(values.data());
  const size_t total = values.size() * sizeof(float);
  for (size_t done = 0; done < total;) {
    const ssize_t n = ::pwrite(fd_.get(), p + done, total - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, dir_, "write");
    }
    done += static_cast<size_t>(n);
  }
  size_ = values.size();
  return absl::OkStatus();
}

absl::Status SpillFile::ReadAt(size_t first, absl::Span<float> out) const {
  char* p = reinterpret_cast<char*>(out.data());
  const size_t total = out.size() * sizeof(float);
  const size_t offset = first * sizeof(float);
  for (size_t done = 0; done < total;) {
    const ssize_t n = ::pread(fd_.get(), p + done, total - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, dir_, "read");
    }
    if (n == 0) return absl::DataLossError(absl::StrCat("spill file in ", dir_, ": truncated"));
    done += static_cast<size_t>(n);
  }
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
