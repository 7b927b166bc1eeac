#include "libs/common/fd.h"

#include <sys/types.h>

#include <algorithm>
#include <cerrno>

namespace shoal {
namespace {

// Linux moves at most about 2 GiB per call; smaller steps keep every count in range.
constexpr size_t kMaxStep = size_t{1} << 30;

template <typename Call>
int TransferFull(size_t size, int64_t offset, bool reading, Call call) {
  for (size_t done = 0; done < size;) {
    const size_t step = std::min(size - done, kMaxStep);
    const ssize_t n =
        call(done, step, offset == kAtPosition ? offset : offset + static_cast<int64_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0 && reading) return kEndOfFile;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

int ReadFull(int fd, void* data, size_t size, int64_t offset) {
  char* p = static_cast<char*>(data);
  return TransferFull(size, offset, /*reading=*/true, [&](size_t done, size_t step, int64_t at) {
    return at == kAtPosition ? ::read(fd, p + done, step)
                             : ::pread(fd, p + done, step, static_cast<off_t>(at));
  });
}

int WriteFull(int fd, const void* data, size_t size, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  return TransferFull(size, offset, /*reading=*/false, [&](size_t done, size_t step, int64_t at) {
    return at == kAtPosition ? ::write(fd, p + done, step)
                             : ::pwrite(fd, p + done, step, static_cast<off_t>(at));
  });
}

}  // namespace shoal
