#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace shoal {

// Owns a file descriptor: closes it when destroyed. Movable, not copyable.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the descriptor.
  int release() { return std::exchange(fd_, -1); }

 private:
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
};

// Transfers exactly `size` bytes to or from `fd` at byte `offset` (pread/pwrite), or at the
// file position when `offset` is kAtPosition (read/write), retrying short transfers and EINTR.
// Returns 0 when done, the errno of a failed call, or kEndOfFile when the file ends first (reads
// only); the caller turns that into an error naming its file.
inline constexpr int64_t kAtPosition = -1;
inline constexpr int kEndOfFile = -1;
int ReadFull(int fd, void* data, size_t size, int64_t offset = kAtPosition);
int WriteFull(int fd, const void* data, size_t size, int64_t offset = kAtPosition);

}  // namespace shoal
