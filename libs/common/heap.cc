#include "libs/common/heap.h"

#include <malloc.h>

namespace shoal {

void ReturnFreeMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace shoal
