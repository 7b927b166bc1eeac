#include "libs/training/fashion_mnist.h"

#include <zlib.h>

#include <array>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace shoal::training {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
// Guards against absurd headers before allocating.
constexpr uint64_t kMaxBytes = uint64_t{1} << 30;

std::string FilePath(const std::string& dir, Split split, bool images) {
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  const char* kind = images ? "images-idx3" : "labels-idx1";
  return (std::filesystem::path(dir) / absl::StrCat(prefix, "-", kind, "-ubyte.gz")).string();
}

// Reads a whole gzip file into memory.
absl::StatusOr<std::vector<uint8_t>> ReadGzip(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("dataset file ", path, " does not exist"));
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open dataset file ", path));
  }
  gzbuffer(file, 1 << 20);
  std::vector<uint8_t> out;
  std::array<uint8_t, 1 << 16> buf;
  while (true) {
    int n = gzread(file, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(file, &errnum);
      gzclose(file);
      return absl::InvalidArgumentError(
          absl::StrCat("dataset file ", path, " is not a valid gzip file: ", msg));
    }
    if (n == 0) break;
    out.insert(out.end(), buf.data(), buf.data() + n);
    if (out.size() > kMaxBytes) {
      gzclose(file);
      return absl::InvalidArgumentError(absl::StrCat("dataset file ", path, " is too large"));
    }
  }
  gzclose(file);
  return out;
}

uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

absl::Status CheckFashionMnistDir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("dataset directory ", dir, " does not exist"));
  }
  for (Split split : {Split::kTrain, Split::kTest}) {
    for (bool images : {true, false}) {
      std::string path = FilePath(dir, split, images);
      if (!std::filesystem::is_regular_file(path, ec)) {
        return absl::NotFoundError(absl::StrCat("dataset file ", path, " does not exist"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RawDataset> LoadFashionMnist(const std::string& dir, Split split, size_t limit) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("dataset directory ", dir, " does not exist"));
  }
  const std::string images_path = FilePath(dir, split, /*images=*/true);
  const std::string labels_path = FilePath(dir, split, /*images=*/false);
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint8_t> images, ReadGzip(images_path));
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadGzip(labels_path));

  if (images.size() < 16 || ReadBigEndian32(images.data()) != kImagesMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset file ", images_path, " is not an IDX image file (bad magic)"));
  }
  if (labels.size() < 8 || ReadBigEndian32(labels.data()) != kLabelsMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset file ", labels_path, " is not an IDX label file (bad magic)"));
  }
  const uint64_t n_images = ReadBigEndian32(images.data() + 4);
  const uint64_t rows = ReadBigEndian32(images.data() + 8);
  const uint64_t cols = ReadBigEndian32(images.data() + 12);
  const uint64_t n_labels = ReadBigEndian32(labels.data() + 4);
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset file ", images_path, " has bad image dimensions ", rows, "x", cols));
  }
  if (images.size() != 16 + n_images * rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat("dataset file ", images_path, " has ",
                                                   images.size() - 16, " pixel bytes, header says ",
                                                   n_images, " images of ", rows, "x", cols));
  }
  if (labels.size() != 8 + n_labels) {
    return absl::InvalidArgumentError(absl::StrCat("dataset file ", labels_path, " has ",
                                                   labels.size() - 8, " labels, header says ",
                                                   n_labels));
  }
  if (n_images != n_labels) {
    return absl::InvalidArgumentError(absl::StrCat("dataset files ", images_path, " and ",
                                                   labels_path, " disagree: ", n_images,
                                                   " images but ", n_labels, " labels"));
  }
  uint64_t count = n_images;
  if (limit > 0 && limit < count) count = limit;

  RawDataset out;
  out.count = count;
  out.rows = static_cast<int>(rows);
  out.cols = static_cast<int>(cols);
  out.pixels.assign(images.begin() + 16, images.begin() + 16 + count * rows * cols);
  out.labels.assign(labels.begin() + 8, labels.begin() + 8 + count);
  for (size_t i = 0; i < count; ++i) {
    if (out.labels[i] >= kFashionMnistClasses) {
      return absl::InvalidArgumentError(absl::StrCat("dataset file ", labels_path, ": label ",
                                                     int{out.labels[i]}, " of sample ", i,
                                                     " is out of range [0, 10)"));
    }
  }
  return out;
}

}  // namespace shoal::training
