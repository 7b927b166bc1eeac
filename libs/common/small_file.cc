#include "libs/common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/fd.h"

namespace shoal {
namespace {

// `verb` is "open" or "read".
absl::Status ErrnoStatus(int err, const std::string& path, absl::string_view verb,
                         absl::string_view what) {
  const std::string msg =
      absl::StrCat(EscapeBytes(path), ": cannot ", verb, " the ", what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// `size` is "" when unknown (a pipe that went past the cap).
absl::Status TooLarge(const std::string& path, absl::string_view what, absl::string_view size,
                      size_t max_bytes) {
  return absl::InvalidArgumentError(absl::StrCat(EscapeBytes(path), ": the ", what, " is ", size,
                                                 size.empty() ? "" : ", ", "over the limit of ",
                                                 DescribeBytes(max_bytes)));
}

}  // namespace

std::string DescribeBytes(size_t bytes) {
  std::string out = absl::StrCat(bytes, " bytes");
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) {
    absl::StrAppend(&out, " (", bytes >> 20, " MiB)");
  } else if (bytes >= (size_t{1} << 10) && bytes % (size_t{1} << 10) == 0) {
    absl::StrAppend(&out, " (", bytes >> 10, " KiB)");
  }
  return out;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes,
                                          absl::string_view what) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, path, "open", what);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, path, "read", what);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(EscapeBytes(path), ": is a directory, not a ", what));
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    return TooLarge(path, what, DescribeBytes(static_cast<size_t>(st.st_size)), max_bytes);
  }
  // Read at most one byte past the cap: a file that grew, or a pipe, is still bounded.
  std::string text;
  text.resize(max_bytes + 1);
  size_t used = 0;
  while (used < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + used, text.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "read", what);
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  if (used > max_bytes) return TooLarge(path, what, "", max_bytes);
  text.resize(used);
  return text;
}

}  // namespace shoal
