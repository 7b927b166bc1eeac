#include "libs/common/direct_writer.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "libs/common/fd.h"

namespace shoal {

void DirectWriter::FreeAligned::operator()(char* p) const { std::free(p); }

DirectWriter::DirectWriter(int fd, uint64_t offset) : fd_(fd), next_(offset) {}

DirectWriter::~DirectWriter() {
  if (direct_) SetDirect(false);
}

int DirectWriter::SetDirect(bool on) {
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0) return errno;
  if (::fcntl(fd_, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) != 0) return errno;
  direct_ = on;
  return 0;
}

int DirectWriter::Append(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  if (finished_) {
    const int err = WriteFull(fd_, p, size, static_cast<int64_t>(next_));
    if (err == 0) next_ += size;
    return err;
  }
  // Up to the first aligned offset: through the page cache. Then, once, try direct I/O.
  if (staged_ == 0 && next_ % kAlignment != 0) {
    const size_t head = std::min(size, kAlignment - next_ % kAlignment);
    if (const int err = WriteFull(fd_, p, head, static_cast<int64_t>(next_)); err != 0) {
      return err;
    }
    next_ += head;
    p += head;
    size -= head;
  }
  if (size == 0) return 0;
  if (block_ == nullptr) {
    // Refused (EINVAL): the file system has no direct I/O; everything goes buffered.
    if (SetDirect(true) != 0) finished_ = true;
    if (!finished_) {
      block_.reset(static_cast<char*>(std::aligned_alloc(kAlignment, kBlock)));
      if (block_ == nullptr) {
        SetDirect(false);
        finished_ = true;
      }
    }
    if (finished_) return Append(p, size);
  }
  while (size > 0) {
    const size_t n = std::min(size, kBlock - staged_);
    std::memcpy(block_.get() + staged_, p, n);
    staged_ += n;
    next_ += n;
    p += n;
    size -= n;
    if (staged_ == kBlock) {
      if (const int err = WriteAligned(block_.get(), kBlock, next_ - kBlock); err != 0) return err;
      staged_ = 0;
    }
  }
  return 0;
}

int DirectWriter::WriteAligned(const char* data, size_t size, uint64_t at) {
  int err = WriteFull(fd_, data, size, static_cast<int64_t>(at));
  if (err == EINVAL && direct_) {
    // Direct I/O refused after all (or a short write left an unaligned rest): the same bytes
    // again, through the page cache, and so from now on.
    if (const int off = SetDirect(false); off != 0) return off;
    err = WriteFull(fd_, data, size, static_cast<int64_t>(at));
  }
  return err;
}

int DirectWriter::Finish() {
  if (finished_) return 0;
  finished_ = true;
  int err = 0;
  if (staged_ > 0) {
    const uint64_t start = next_ - staged_;
    const size_t whole = staged_ - staged_ % kAlignment;
    if (whole > 0) err = WriteAligned(block_.get(), whole, start);
    if (direct_) {
      const int off = SetDirect(false);
      if (err == 0) err = off;
    }
    if (err == 0 && whole < staged_) {
      err = WriteFull(fd_, block_.get() + whole, staged_ - whole,
                      static_cast<int64_t>(start + whole));
    }
    staged_ = 0;
  } else if (direct_) {
    err = SetDirect(false);
  }
  block_.reset();
  return err;
}

}  // namespace shoal
