#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace shoal {

// Writes a stream of bytes to consecutive offsets of a file around the page cache (O_DIRECT):
// the bytes are gathered into aligned blocks in a staging buffer and each full block goes to the
// device in one write. Why: a model-sized file written through the page cache costs the writer's
// CPU three times over (copying into freshly allocated pages, writing them back at fsync,
// dropping them when the file is deleted); written directly it costs one copy into the staging
// buffer. The bytes before the first aligned offset, and after the last whole alignment unit,
// go through the page cache; so does everything where the file system refuses direct I/O
// (tmpfs, some network file systems). The caller's fsync makes all of it durable.
//
// Errors are errno values (0: done), as WriteFull's. Not thread-safe.
class DirectWriter {
 public:
  static constexpr size_t kAlignment = 4096;
  static constexpr size_t kBlock = size_t{4} << 20;

  // Bytes appended go to `fd` (open for writing, not owned) from `offset` on.
  DirectWriter(int fd, uint64_t offset);
  ~DirectWriter();
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;

  int Append(const void* data, size_t size);
  // Writes what is staged and turns the descriptor back to buffered I/O. Appending after it
  // writes through the page cache.
  int Finish();

  // Whether the blocks go around the page cache (false where the file system refused).
  bool direct() const { return direct_; }

 private:
  // Writes `size` bytes at `at` (aligned: a staged block, or the aligned part of the last one).
  int WriteAligned(const char* data, size_t size, uint64_t at);
  int SetDirect(bool on);

  const int fd_;
  uint64_t next_;  // the file offset of the next byte appended
  bool direct_ = false;
  bool finished_ = false;
  struct FreeAligned {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, FreeAligned> block_;
  size_t staged_ = 0;  // bytes in block_, which start at next_ - staged_
};

}  // namespace shoal
