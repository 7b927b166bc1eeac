#pragma once

#include <cstddef>
#include <vector>

namespace shoal {

// Gives the heap's free memory back to the system (glibc's malloc_trim): for a process done with
// a large piece of work, e.g. a peer between the steps of a round, whose heap would otherwise
// keep up to rpc::TuneAllocatorForModelStreams()'s trim threshold.
void ReturnFreeMemory();

// What the heap holds now (glibc's mallinfo2, over every arena): bytes handed out and not freed
// yet (including blocks mapped on their own), and free bytes it keeps instead of giving them back
// to the system (see ReturnFreeMemory). Zeros without glibc.
struct HeapUse {
  size_t in_use = 0;
  size_t free = 0;
};
HeapUse MeasureHeap();

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes) with transparent huge
// pages (madvise MADV_HUGEPAGE), for memory not touched yet. A model-sized buffer then takes a
// few hundred page faults instead of one per 4 KiB page; on a virtual machine those faults were
// most of a model download's time (scripts/bench-transfer: GetModel 0.23 -> 1.3 GB/s). Does
// nothing where transparent huge pages are off ("never") or the range holds no whole huge page.
void AdviseHugePages(void* data, size_t bytes);

// Reserves room for `n` elements in `v` and, when that allocates, advises the new storage for
// huge pages before anything touches it (see AdviseHugePages). For model-sized buffers that are
// filled right after.
template <typename T>
void ReserveLarge(std::vector<T>& v, size_t n) {
  if (n <= v.capacity()) return;
  v.reserve(n);
  AdviseHugePages(v.data(), n * sizeof(T));
}

}  // namespace shoal
