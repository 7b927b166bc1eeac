#include "libs/capacity/blas_library.h"

#include <link.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shoal::capacity {
namespace {

bool IsBlasFile(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  return absl::StartsWith(name, "libblas.so") || absl::StartsWith(name, "libopenblas.so");
}

std::string Resolved(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) return path;
  std::string out(real);
  free(real);
  return out;
}

}  // namespace

BlasLibrary::Kind ClassifyBlas(const std::string& resolved_path) {
  if (resolved_path.empty()) return BlasLibrary::Kind::kNone;
  const std::filesystem::path p(resolved_path);
  if (p.parent_path().filename() == "blas") return BlasLibrary::Kind::kReference;
  return BlasLibrary::Kind::kOptimised;
}

BlasLibrary LoadedBlas() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<std::string*>(data);
        if (info->dlpi_name != nullptr && IsBlasFile(info->dlpi_name)) {
          *out = info->dlpi_name;
          return 1;  // stop
        }
        return 0;
      },
      &found);
  BlasLibrary blas;
  if (found.empty()) return blas;
  blas.path = Resolved(found);
  blas.kind = ClassifyBlas(blas.path);
  return blas;
}

std::string DescribeBlas(const BlasLibrary& blas) {
  switch (blas.kind) {
    case BlasLibrary::Kind::kNone:
      return "built in";
    case BlasLibrary::Kind::kReference:
      return absl::StrCat("the reference BLAS at ", blas.path);
    case BlasLibrary::Kind::kOptimised:
      break;
  }
  const bool openblas = absl::StrContains(blas.path, "openblas");
  return absl::StrCat(openblas ? "OpenBLAS" : "BLAS", " at ", blas.path);
}

std::optional<std::string> BlasWarning(const BlasLibrary& blas) {
  if (blas.kind == BlasLibrary::Kind::kOptimised &&
      absl::StrContains(blas.path, "/openblas-serial/")) {
    return absl::StrCat(
        "training runs its matrix products in ", DescribeBlas(blas),
        ", OpenBLAS's serial build, which now and then returns wrong products when threads of "
        "one process call it at once (a peer evaluates one model while it trains the next): "
        "install libopenblas0-pthread (scripts/bootstrap runtime; Shoal runs it on one thread "
        "per call), or point libblas.so.3, liblapack.so.3 and libopenblas.so.0 at it "
        "(update-alternatives --config libblas.so.3-x86_64-linux-gnu, and the same for the "
        "others)");
  }
  if (blas.kind != BlasLibrary::Kind::kReference) return std::nullopt;
  return absl::StrCat("training runs its matrix products in ", DescribeBlas(blas),
                      ", about 1.7x slower than in OpenBLAS: install libopenblas0-pthread "
                      "(scripts/bootstrap runtime), or point libblas.so.3 at an optimised BLAS "
                      "(update-alternatives --config libblas.so.3-x86_64-linux-gnu)");
}

}  // namespace shoal::capacity
