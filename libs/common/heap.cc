#include "libs/common/heap.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdint>

namespace shoal {

void ReturnFreeMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

HeapUse MeasureHeap() {
  HeapUse use;
#ifdef __GLIBC__
  const struct mallinfo2 info = mallinfo2();
  use.in_use = info.uordblks + info.hblkhd;
  use.free = info.fordblks;
#endif
  return use;
}

void AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end <= begin) return;
  // Advice only: where the kernel has no transparent huge pages it fails, and nothing changes.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace shoal
