#pragma once

// Image classification data sets laid out as one directory per class (the "ImageFolder" layout
// of torchvision and Keras), read without LibTorch so that any peer can check and load its files.
// PNG and JPEG only, decoded by libpng and libjpeg-turbo (image_decode.h).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/dataset.h"

namespace shoal::data {

struct ImageFolderOptions {
  // Every image is resized to height x width (1..4096 each; required).
  int height = 0;
  int width = 0;
  // 1 (grayscale) or 3 (RGB); required. Images with another channel count are refused rather
  // than converted, so that a mislabelled data set fails loudly instead of training on garbage.
  int channels = 0;
  // Class names in label order. Empty: the subdirectory names, sorted bytewise.
  std::vector<std::string> classes;
  // With `classes`: a class whose directory is missing or empty holds no samples instead of
  // being an error (a peer's own data need not cover every class).
  bool allow_missing_classes = false;
  // Per-channel normalisation after scaling pixels to [0, 1]: (x - mean[c]) / std[c]. Each is
  // either empty (mean 0, std 1) or exactly `channels` finite values; std > 0.
  std::vector<float> mean;
  std::vector<float> std;
  // A larger file is refused before it is read (1..2^31-1).
  uint64_t max_image_bytes = 64 << 20;
  // More images than this in the folder are refused before any is decoded.
  uint64_t max_images = 10'000'000;
};

// A loaded folder and what the loader passed over, for the caller to log.
struct ImageFolderLoad {
  Dataset dataset;
  // Entries that are not images: other extensions, dotfiles, directories inside a class
  // directory, plain files and dot-directories beside the class directories.
  uint64_t skipped_files = 0;
  // Images whose size differed from height x width.
  uint64_t resized_images = 0;
};

// Reads DIR/<class>/<file>.{png,jpg,jpeg} (extensions case-insensitive; other entries are
// skipped and counted, subdirectories of a class directory are not entered). Samples are ordered
// by label, then by file name (bytewise), so every peer with the same files gets the same order.
// dataset.sample_shape = {channels, height, width}, planar (all of channel 0, then channel 1...);
// class_names are the labels' names; feature_names is empty.
//
// Errors, each message starting with the path concerned:
//   NOT_FOUND: `dir` missing; no class directories; a class of options.classes without a
//     directory (the message lists the directories found); a class directory with no images.
//   INVALID_ARGUMENT: an option out of range (named); a directory not in a non-empty
//     options.classes; `dir` not a directory; more than max_images images; a file over
//     max_image_bytes; a file that is not a PNG or JPEG, or is corrupt or truncated (with the
//     decoder's reason); an image whose channel count differs from options.channels, including
//     any image with an alpha channel (2 or 4 channels) and CMYK JPEGs.
//   PERMISSION_DENIED / INTERNAL: a directory or file that cannot be read.
// Prints nothing. Thread-safe.
absl::StatusOr<ImageFolderLoad> LoadImageFolderWithReport(const std::string& dir,
                                                          const ImageFolderOptions& options);

// LoadImageFolderWithReport's data set alone.
absl::StatusOr<Dataset> LoadImageFolder(const std::string& dir, const ImageFolderOptions& options);

}  // namespace shoal::data
