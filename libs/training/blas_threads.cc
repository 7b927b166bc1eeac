#include "libs/training/blas_threads.h"

#include <dlfcn.h>

#include <mutex>

namespace shoal::training {

void UseOneBlasThreadPerCall() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Exported by libopenblas.so.0, which Debian's OpenBLAS libblas.so.3 loads.
    using SetThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(1);
    }
  });
}

}  // namespace shoal::training
