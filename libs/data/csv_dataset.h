#pragma once

// Tabular data sets from CSV files (RFC 4180, parsed by libcsv): one header row, then one sample
// per row with numeric feature columns and a label column. The file is streamed in blocks, so
// memory stays at about the loaded float values plus one row.
//
// Every error names the file first and, where one applies, the line, e.g.
//   train.csv:17: column "age": "abc" is not a number
// Lines are counted by '\n' (CRLF files count the same; a file that ends lines with a lone CR
// is one long line). A row's line is the line its first cell starts on, so rows after a quoted
// cell holding a newline keep their true line numbers. Values quoted from the file are escaped
// (libs/common/escape.h) and cut to 40 bytes.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/data/dataset.h"

namespace shoal::data {

// Caps that keep a hostile or mistaken file from exhausting memory before max_bytes does.
inline constexpr size_t kMaxCsvColumns = 100'000;
inline constexpr size_t kMaxCsvCellBytes = size_t{1} << 20;  // one cell, after unquoting
inline constexpr uint32_t kMaxCsvClasses = 100'000;          // class_names a file may imply

struct CsvOptions {
  // Required: the header name of the label column.
  std::string label_column;
  // The feature columns, in the order the features take. Empty: every column but the label, in
  // file order.
  std::vector<std::string> feature_columns;
  // Class labels. Empty: labels must be non-negative integers written in decimal digits (0, 3,
  // 12) and class_names become "0".."max" (max = the largest label seen, or num_classes - 1 when
  // num_classes is set). Non-empty: each label cell must be one of these strings, and its label
  // is its index here, so the order given fixes the label numbering.
  std::vector<std::string> classes;
  // Integer labels only: when > 0, a label >= num_classes is an error. With `classes` it must be
  // 0 or classes.size().
  uint32_t num_classes = 0;
  // Files larger than this are refused before anything is read.
  uint64_t max_bytes = uint64_t{4} << 30;
};

// Loads `path` into a Dataset with sample_shape {features}, feature_names from the header and
// class_names as CsvOptions describes.
//
// Rules: the first row is the header (a UTF-8 byte order mark before it is dropped); header
// names are unique; blank lines are skipped anywhere; every row has as many cells as the header;
// feature cells are finite numbers (absl::SimpleAtof: surrounding spaces allowed, nan/inf and
// overflow refused); unquoted cells lose surrounding spaces and tabs, quoted cells keep them
// (label cells are trimmed either way).
//
// Errors: NOT_FOUND missing file; PERMISSION_DENIED unreadable; INTERNAL other read failures;
// INVALID_ARGUMENT for bad options, a directory, a file over max_bytes, and every problem with
// the contents (empty file, no data rows, duplicate or missing columns, malformed quoting, ragged
// rows, bad numbers or labels, the caps above).
absl::StatusOr<Dataset> LoadCsv(const std::string& path, const CsvOptions& options);

// Per-feature statistics for `standardize` normalisation; index i belongs to feature i (a
// table's column, or an image's channel: Dataset::FeatureCount()).
struct Standardization {
  std::vector<float> mean;
  std::vector<float> stddev;
};

// Mean and population standard deviation of each feature over all samples (of an image's
// channel: over all its pixels), accumulated in double. A feature with standard deviation 0 gets
// stddev 1, so it maps to 0 rather than dividing by zero. INVALID_ARGUMENT for an empty data set,
// values whose size does not match count * SampleSize(), or statistics that are not finite.
absl::StatusOr<Standardization> ComputeStandardization(const Dataset& data);

// values = (values - mean) / stddev per feature, in place. INVALID_ARGUMENT (and `data` left
// unchanged) when the sizes do not match the data's features, a mean is not finite, a stddev
// is not > 0 and finite, or a standardised value would not fit a float (statistics of one split
// applied to far larger values of another). Statistics computed on the training split are meant
// to be applied to the test split as well.
absl::Status ApplyStandardization(const Standardization& s, Dataset& data);

// The checks of ApplyStandardization alone, without changing `data`: OK when it would succeed.
absl::Status CheckStandardization(const Standardization& s, const Dataset& data);

}  // namespace shoal::data
