#pragma once

#include <optional>
#include <string>

namespace shoal::capacity {

// The BLAS library this process loaded (LibTorch's matrix products on the CPU run in it), as
// found among the loaded shared objects: Debian's LibTorch loads libblas.so.3, which the
// alternatives system points at OpenBLAS (libopenblas0-pthread, what scripts/bootstrap installs;
// or its serial build, libopenblas0-serial, which is not safe for threads that call it at once)
// or at the reference implementation (libblas3), with which the default task's training took
// 1.7 times as long on the development machine.
struct BlasLibrary {
  enum class Kind { kNone, kReference, kOptimised };
  Kind kind = Kind::kNone;
  std::string path;  // the loaded file with its links resolved; empty with kNone
};

// kReference for Debian's reference BLAS (a file in a directory named "blas", as
// /usr/lib/x86_64-linux-gnu/blas/libblas.so.3), kOptimised for any other file, kNone for an
// empty path. Pure: for the tests.
BlasLibrary::Kind ClassifyBlas(const std::string& resolved_path);

// The first loaded libblas.so* or libopenblas.so*, resolved; kNone when there is none (a
// LibTorch with MKL built in, or a process without LibTorch).
BlasLibrary LoadedBlas();

// For a log line: "OpenBLAS at PATH", "the reference BLAS at PATH" or "built in".
std::string DescribeBlas(const BlasLibrary& blas);

// What a process that trains on the CPU logs as a warning: how to get an optimised BLAS, for
// kReference, and a BLAS that is safe for concurrent callers, for OpenBLAS's serial build;
// nullopt otherwise.
std::optional<std::string> BlasWarning(const BlasLibrary& blas);

}  // namespace shoal::capacity
