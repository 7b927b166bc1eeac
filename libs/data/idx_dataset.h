#pragma once

// Data sets in IDX files, the MNIST file format: an images file and a labels file, each plain or
// gzip-compressed (told apart by the gzip magic bytes, not the name). Read through zlib in
// blocks, so that memory stays at about the loaded float values however the file is packed.
//
// An IDX file is a header, 00 00 <type> <ndims>, then ndims big-endian uint32 dimensions, then
// the product of the dimensions in big-endian elements of <type>: 0x08 uint8, 0x09 int8,
// 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/dataset.h"

namespace shoal::data {

// Labels past this are refused, whatever the options say: a class count implied by one bad
// label would otherwise size every model's output layer.
inline constexpr uint32_t kMaxIdxClasses = 100'000;

struct IdxOptions {
  // > 0: a label >= num_classes is an error. 0: the class count is classes.size() when classes
  // are given, else the largest label + 1.
  uint32_t num_classes = 0;
  // Class names in label order; empty: "0".."C-1". When given, its size is the class count
  // (num_classes, if also set, must equal it).
  std::vector<std::string> classes;
  // A file whose header declares more than this many bytes (header included, after
  // decompression) is refused before its data is read.
  uint64_t max_bytes = uint64_t{8} << 30;
};

// Loads `images_path` (n samples: dims [n, d1, ..., dk]) with the labels of `labels_path` (a 1-D
// file of n integers, types 0x08, 0x09, 0x0B or 0x0C).
//
// sample_shape is {1, d1, d2} for k == 2 (one grayscale channel, as libs/training's convolutions
// expect), {1} for k == 0 (one scalar per sample) and {d1, ..., dk} otherwise. uint8 values are
// scaled to [0, 1] (x / 255); the other types are converted to float as they are. class_names
// as IdxOptions says; feature_names stays empty.
//
// Errors, each message starting with the path of the file concerned:
//   NOT_FOUND: a missing file. PERMISSION_DENIED: an unreadable one. INTERNAL: other I/O errors.
//   INVALID_ARGUMENT: options that contradict each other; a directory; a bad magic or an
//     unsupported type; no dimensions, a zero dimension, a size that overflows or is over
//     max_bytes; a labels file that is not 1-D integers; a truncated header or data (with the
//     bytes expected and found) or corrupt gzip data; bytes after the data; a non-finite value
//     or a float64 outside float32's range (with the sample index); a negative label, one >=
//     the class count or kMaxIdxClasses (with the sample index); label and image counts that
//     differ; class names whose count is not the class count.
// Prints nothing. Thread-safe.
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path,
                                const IdxOptions& options);

}  // namespace shoal::data
