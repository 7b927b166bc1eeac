#pragma once

namespace shoal::training {

// LibTorch runs its matrix products on the CPU in the BLAS that libblas.so.3 points at; on a
// machine set up by scripts/bootstrap that is OpenBLAS's threaded build (libopenblas0-pthread).
// A process may train and evaluate several models at once (a peer evaluates a model while it
// trains the next round, runs tasks side by side; a test holds many peers), so several threads
// call into BLAS at once: OpenBLAS's threaded build is safe for that, its serial build
// (libopenblas0-serial) is not (it returns wrong products now and then; OpenBLAS compiles its
// locks only into threaded builds unless built with USE_LOCKING). And each caller already is
// one of the process's training or evaluation threads, so OpenBLAS's own threads would only
// compete with them for the cores: this makes OpenBLAS run every call on the calling thread
// (openblas_set_num_threads(1), looked up at run time, so any other BLAS is left as it is).
// Idempotent and thread-safe; Trainer::Build calls it before any model exists.
void UseOneBlasThreadPerCall();

}  // namespace shoal::training
