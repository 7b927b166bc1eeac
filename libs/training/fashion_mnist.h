#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::training {

// One split of an IDX image dataset (Fashion-MNIST) as raw bytes: `count` images of rows x cols
// uint8 pixels, row-major, one after the other, and `count` labels. Torch-free so that loading
// and partitioning can be tested and reused without LibTorch. A value type.
struct RawDataset {
  size_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
  std::vector<uint8_t> labels;  // count, each in [0, num_classes)

  size_t image_size() const { return static_cast<size_t>(rows) * cols; }
};

enum class Split { kTrain, kTest };

inline constexpr int kFashionMnistClasses = 10;

// Reads `{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz` from `dir` (gzip-compressed IDX files,
// as shipped by Debian's dataset-fashion-mnist package). `limit` > 0 keeps only the first
// `limit` samples. Errors: NOT_FOUND missing directory or file; INVALID_ARGUMENT a file that is
// not a valid IDX file of the expected kind (bad magic, truncated, mismatched counts, label out
// of range); every message names the file.
absl::StatusOr<RawDataset> LoadFashionMnist(const std::string& dir, Split split, size_t limit = 0);

// Checks that `dir` holds the four Fashion-MNIST files (cheap: no decompression).
// Errors: NOT_FOUND naming the missing directory or file.
absl::Status CheckFashionMnistDir(const std::string& dir);

}  // namespace shoal::training
