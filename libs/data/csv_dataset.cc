#include "libs/data/csv_dataset.h"

#include <csv.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/common/escape.h"
#include "libs/common/fd.h"
#include "libs/common/small_file.h"
#include "libs/common/status_macros.h"

namespace shoal::data {
namespace {

// Bytes read per read(2): large enough that syscalls do not dominate, small enough that the
// buffer is noise next to the values.
constexpr size_t kReadBlockBytes = size_t{1} << 20;
// A regular file's block is sized to the file (one more byte sees its end in the same read), but
// never below this, so a small table does not pay for zeroing a megabyte.
constexpr size_t kMinReadBlockBytes = 4096;
// Values and names quoted in errors are cut here, so one huge cell cannot flood a log line.
constexpr size_t kQuotedValueBytes = 40;
// Names an error lists (header columns, classes) before "... and N more".
constexpr size_t kListedNames = 16;
constexpr absl::string_view kUtf8Bom = "\xEF\xBB\xBF";

std::string Quote(absl::string_view s) { return QuoteBytes(s, kQuotedValueBytes); }

std::string ListNames(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min(names.size(), kListedNames);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    out += Quote(names[i]);
  }
  if (names.size() > shown) absl::StrAppend(&out, ", ... and ", names.size() - shown, " more");
  return out;
}

// libcsv grows its one-cell buffer through this. Refusing to grow past the cap makes csv_parse
// stop with CSV_ENOMEM instead of buffering an endless (e.g. never-closed quoted) cell. libcsv
// passes no user data to it, hence a fixed cap.
void* CappedRealloc(void* p, size_t size) {
  if (size > kMaxCsvCellBytes + 1) return nullptr;  // + 1: CSV_APPEND_NULL's terminator
  return std::realloc(p, size);
}

absl::Status ErrnoError(int err, const std::string& shown_path, absl::string_view verb) {
  const std::string msg =
      absl::StrCat(shown_path, ": cannot ", verb, " the CSV file: ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

absl::Status TooLarge(const std::string& shown_path, uint64_t size, bool exact, uint64_t max) {
  return absl::InvalidArgumentError(absl::StrCat(shown_path, ": the CSV file is ",
                                                 exact ? "" : "more than ", DescribeBytes(size),
                                                 ", over the limit of ", DescribeBytes(max)));
}

// Fills `block` unless the file ends first (so the first block holds a whole BOM); returns the
// bytes read, 0 at end of file.
absl::StatusOr<size_t> ReadBlock(int fd, std::vector<char>& block, const std::string& shown) {
  size_t used = 0;
  while (used < block.size()) {
    const ssize_t n = ::read(fd, block.data() + used, block.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, shown, "read");
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  return used;
}

absl::Status ValidateOptions(const std::string& shown, const CsvOptions& options) {
  const auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": CsvOptions: ", parts...));
  };
  if (options.label_column.empty()) return bad("label_column is empty; name the label column");
  std::unordered_map<std::string, size_t> seen;
  for (const std::string& name : options.feature_columns) {
    if (name == options.label_column) {
      return bad("feature_columns holds the label column ", Quote(name));
    }
    if (!seen.emplace(name, 0).second) return bad("feature_columns names ", Quote(name), " twice");
  }
  if (options.classes.size() > kMaxCsvClasses) {
    return bad(options.classes.size(), " classes, over the limit of ", kMaxCsvClasses);
  }
  seen.clear();
  for (const std::string& name : options.classes) {
    if (!seen.emplace(name, 0).second) return bad("classes names ", Quote(name), " twice");
  }
  if (options.num_classes > kMaxCsvClasses) {
    return bad("num_classes ", options.num_classes, " is over the limit of ", kMaxCsvClasses);
  }
  if (!options.classes.empty() && options.num_classes != 0 &&
      options.num_classes != options.classes.size()) {
    return bad("num_classes ", options.num_classes, " does not match the ", options.classes.size(),
               " classes given");
  }
  return absl::OkStatus();
}

// Receives libcsv's cell and row callbacks for one file and builds the Dataset one row at a
// time: only the current row's values are held apart from the result. Lives on LoadCsv's stack;
// not thread-safe.
class TableBuilder {
 public:
  TableBuilder(const std::string& shown_path, const CsvOptions& options)
      : path_(shown_path), options_(options) {
    for (size_t i = 0; i < options.classes.size(); ++i) {
      class_index_.emplace(options.classes[i], static_cast<uint32_t>(i));
    }
  }

  // The line the bytes handed to libcsv now are on; cells end on this line.
  void set_line(uint64_t line) { line_ = line; }
  uint64_t line() const { return line_; }
  const absl::Status& status() const { return status_; }
  void set_status(absl::Status status) { status_ = std::move(status); }
  // "path:17: "
  std::string At(uint64_t line) const { return absl::StrCat(path_, ":", line, ": "); }

  void OnCell(absl::string_view cell) {
    if (!status_.ok()) return;
    if (cells_ == 0) {
      // A quoted first cell may span lines; the row is on the line where that cell starts.
      row_line_ = line_ - static_cast<uint64_t>(std::count(cell.begin(), cell.end(), '\n'));
    }
    const size_t column = cells_++;
    if (!header_done_) {
      if (column >= kMaxCsvColumns) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat(At(row_line_), "the header has more than ", kMaxCsvColumns, " columns"));
        return;
      }
      header_.emplace_back(cell);
      return;
    }
    // Cells past the header's count are only counted: the ragged-row error reports them.
    if (column < roles_.size() && row_error_.ok()) row_error_ = OnDataCell(column, cell);
  }

  void OnRowEnd() {
    if (!status_.ok()) return;
    const size_t cells = std::exchange(cells_, 0);
    last_row_line_ = line_;
    if (!header_done_) {
      header_done_ = true;
      header_line_ = row_line_;
      status_ = SetUpColumns();
      return;
    }
    // The cell count first: a ragged row's cells are misaligned, so their errors would mislead.
    if (cells != header_.size()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(At(row_line_), "the row has ", cells, cells == 1 ? " cell" : " cells",
                       ", expected ", header_.size(), " as in the header"));
      return;
    }
    if (!row_error_.ok()) {
      status_ = std::exchange(row_error_, absl::OkStatus());
      return;
    }
    values_.insert(values_.end(), row_.begin(), row_.end());
    labels_.push_back(row_label_);
  }

  // Called when the file ends inside a quoted cell.
  absl::Status UnclosedQuote() const {
    if (cells_ > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          At(row_line_), "the file ends inside a quoted cell of this row (a quote is not closed)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": the file ends inside a quoted cell that starts after line ",
                     last_row_line_, " (a quote is not closed)"));
  }

  absl::StatusOr<Dataset> Finish() && {
    if (!status_.ok()) return status_;
    if (!header_done_) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": the file is empty; expected a header row"));
    }
    if (labels_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(At(header_line_), "the header is not followed by any data rows"));
    }
    Dataset data;
    data.sample_shape = {static_cast<int64_t>(row_.size())};
    data.count = labels_.size();
    data.values = std::move(values_);
    data.labels = std::move(labels_);
    data.feature_names = std::move(feature_names_);
    if (!options_.classes.empty()) {
      data.class_names = options_.classes;
    } else {
      const uint32_t n = options_.num_classes > 0 ? options_.num_classes : max_label_ + 1;
      data.class_names.reserve(n);
      for (uint32_t i = 0; i < n; ++i) data.class_names.push_back(absl::StrCat(i));
    }
    return data;
  }

 private:
  static constexpr int64_t kIgnored = -1;
  static constexpr int64_t kLabel = -2;

  absl::Status HeaderError(absl::string_view what, absl::string_view name) const {
    return absl::InvalidArgumentError(
        absl::StrCat(At(header_line_), what, " ", Quote(name),
                     " is not in the header (columns: ", ListNames(header_), ")"));
  }

  // Maps header columns to the label and feature slots, once the header row is complete.
  absl::Status SetUpColumns() {
    std::unordered_map<std::string, size_t> index;
    for (size_t i = 0; i < header_.size(); ++i) {
      const auto [it, inserted] = index.emplace(header_[i], i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(At(header_line_), "duplicate column name ",
                                                       Quote(header_[i]), " (columns ",
                                                       it->second + 1, " and ", i + 1, ")"));
      }
    }
    roles_.assign(header_.size(), kIgnored);
    const auto label = index.find(options_.label_column);
    if (label == index.end()) return HeaderError("label column", options_.label_column);
    roles_[label->second] = kLabel;
    if (options_.feature_columns.empty()) {
      for (size_t i = 0; i < header_.size(); ++i) {
        if (i == label->second) continue;
        roles_[i] = static_cast<int64_t>(feature_names_.size());
        feature_names_.push_back(header_[i]);
      }
    } else {
      for (const std::string& name : options_.feature_columns) {
        const auto it = index.find(name);
        if (it == index.end()) return HeaderError("feature column", name);
        roles_[it->second] = static_cast<int64_t>(feature_names_.size());
        feature_names_.push_back(name);
      }
    }
    if (feature_names_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          At(header_line_), "no feature columns: the header has only the label column ",
          Quote(options_.label_column)));
    }
    row_.assign(feature_names_.size(), 0.0f);
    return absl::OkStatus();
  }

  absl::Status CellError(size_t column, absl::string_view cell, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(At(row_line_), "column ", Quote(header_[column]),
                                                   ": ", Quote(cell), " ", what));
  }

  absl::Status OnDataCell(size_t column, absl::string_view cell) {
    const int64_t role = roles_[column];
    if (role == kIgnored) return absl::OkStatus();
    if (role == kLabel) return ParseLabel(column, cell);
    if (absl::StripAsciiWhitespace(cell).empty()) {
      return CellError(column, cell, "is empty; expected a number");
    }
    float value = 0;
    if (!absl::SimpleAtof(cell, &value)) return CellError(column, cell, "is not a number");
    if (!std::isfinite(value)) {
      return CellError(column, cell, "is not a finite number (or is out of float range)");
    }
    row_[static_cast<size_t>(role)] = value;
    return absl::OkStatus();
  }

  absl::Status ParseLabel(size_t column, absl::string_view cell) {
    const absl::string_view text = absl::StripAsciiWhitespace(cell);
    if (!options_.classes.empty()) {
      const auto it = class_index_.find(std::string(text));
      if (it == class_index_.end()) {
        return CellError(column, cell,
                         absl::StrCat("is not one of the classes ", ListNames(options_.classes)));
      }
      row_label_ = it->second;
      return absl::OkStatus();
    }
    const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
    uint32_t label = 0;
    if (!digits) {
      return CellError(column, cell, "is not a class label (a non-negative integer)");
    }
    const uint32_t limit = options_.num_classes > 0 ? options_.num_classes : kMaxCsvClasses;
    if (!absl::SimpleAtoi(text, &label) || label >= limit) {
      return CellError(column, cell,
                       options_.num_classes > 0
                           ? absl::StrCat("is not below num_classes (", limit, ")")
                           : absl::StrCat("is over the limit of ", limit, " classes"));
    }
    row_label_ = label;
    max_label_ = std::max(max_label_, label);
    return absl::OkStatus();
  }

  const std::string path_;  // escaped for messages
  const CsvOptions& options_;
  std::unordered_map<std::string, uint32_t> class_index_;
  absl::Status status_;  // the first error; later callbacks are ignored
  uint64_t line_ = 1;
  uint64_t row_line_ = 1;       // the current row's first line
  uint64_t last_row_line_ = 0;  // the line the last complete row ended on
  uint64_t header_line_ = 1;
  size_t cells_ = 0;  // cells seen in the current row
  bool header_done_ = false;
  std::vector<std::string> header_;
  std::vector<int64_t> roles_;  // per column: kIgnored, kLabel or the feature slot
  std::vector<std::string> feature_names_;
  // The current row. A bad cell is kept in row_error_ and reported at the row's end, after the
  // cell count has been checked.
  std::vector<float> row_;
  uint32_t row_label_ = 0;
  absl::Status row_error_;
  uint32_t max_label_ = 0;
  std::vector<float> values_;
  std::vector<uint32_t> labels_;
};

void CellCallback(void* cell, size_t len, void* builder) {
  static_cast<TableBuilder*>(builder)->OnCell(
      absl::string_view(cell == nullptr ? "" : static_cast<const char*>(cell), len));
}

void RowCallback(int /*terminator*/, void* builder) {
  static_cast<TableBuilder*>(builder)->OnRowEnd();
}

// libcsv's parser state, fed one line at a time so that the builder always knows the line the
// callbacks' cells end on. Owns the parser's buffer; not thread-safe.
class LineFeeder {
 public:
  explicit LineFeeder(TableBuilder& builder) : builder_(builder) {
    // Strict: a stray quote is an error rather than silently becoming data.
    csv_init(&parser_, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL);
    csv_set_realloc_func(&parser_, &CappedRealloc);
  }
  ~LineFeeder() { csv_free(&parser_); }
  LineFeeder(const LineFeeder&) = delete;
  LineFeeder& operator=(const LineFeeder&) = delete;

  absl::Status Feed(absl::string_view bytes) {
    while (!bytes.empty()) {
      const size_t newline = bytes.find('\n');
      const size_t len = newline == absl::string_view::npos ? bytes.size() : newline + 1;
      builder_.set_line(line_);
      const size_t used =
          csv_parse(&parser_, bytes.data(), len, &CellCallback, &RowCallback, &builder_);
      // A builder error came from a cell before the point where libcsv stopped, if it did.
      if (!builder_.status().ok()) return builder_.status();
      if (used < len) return ParseError();
      if (newline != absl::string_view::npos) ++line_;
      bytes.remove_prefix(len);
    }
    return absl::OkStatus();
  }

  // Submits a last row that has no line end.
  absl::Status Finish() {
    builder_.set_line(line_);
    if (csv_fini(&parser_, &CellCallback, &RowCallback, &builder_) != 0) {
      return builder_.UnclosedQuote();
    }
    return builder_.status();
  }

 private:
  absl::Status ParseError() {
    const std::string at = builder_.At(line_);
    switch (csv_error(&parser_)) {
      case CSV_ENOMEM:
      case CSV_ETOOBIG:
        return absl::InvalidArgumentError(absl::StrCat(at, "a cell is longer than the limit of ",
                                                       DescribeBytes(kMaxCsvCellBytes)));
      case CSV_EPARSE:
        return absl::InvalidArgumentError(absl::StrCat(
            at,
            "malformed quoting: a quote may only open a cell, and inside a quoted cell it "
            "must be doubled (\"\") or close the cell before a comma or line end"));
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(at, "CSV parse error: ", csv_strerror(csv_error(&parser_))));
    }
  }

  TableBuilder& builder_;
  struct csv_parser parser_;
  uint64_t line_ = 1;
};

// The feature count, if `data.values` holds count * SampleSize() floats.
absl::StatusOr<size_t> CheckShape(const Dataset& data) {
  const size_t n = data.SampleSize();
  if (n == 0 || data.values.size() != data.count * n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "standardization: the data set has ", data.values.size(), " values, expected count (",
        data.count, ") * sample size (", n, ") and a sample size above 0"));
  }
  return n;
}

// (x - mean) / stddev of feature j, in double: the difference of two finite floats can overflow
// float (3e38 - -1e38).
double Standardized(const Standardization& s, float x, size_t j) {
  return (static_cast<double>(x) - s.mean[j]) / s.stddev[j];
}

std::string FeatureName(const Dataset& data, size_t j) {
  if (data.IsImage()) return absl::StrCat("channel ", j);
  if (data.feature_names.size() == data.SampleSize()) {
    return absl::StrCat("feature ", j, " (", Quote(data.feature_names[j]), ")");
  }
  return absl::StrCat("feature ", j);
}

}  // namespace

absl::StatusOr<Dataset> LoadCsv(const std::string& path, const CsvOptions& options) {
  const std::string shown = EscapeBytes(path);
  SHOAL_RETURN_IF_ERROR(ValidateOptions(shown, options));
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, shown, "open");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, shown, "read");
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": is a directory, not a CSV file"));
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > options.max_bytes) {
    return TooLarge(shown, static_cast<uint64_t>(st.st_size), /*exact=*/true, options.max_bytes);
  }

  TableBuilder builder(shown, options);
  LineFeeder feeder(builder);
  size_t block_bytes = kReadBlockBytes;
  if (S_ISREG(st.st_mode)) {
    block_bytes = static_cast<size_t>(std::clamp<uint64_t>(static_cast<uint64_t>(st.st_size) + 1,
                                                           kMinReadBlockBytes, kReadBlockBytes));
  }
  std::vector<char> block(block_bytes);
  uint64_t total = 0;
  for (bool first = true;; first = false) {
    SHOAL_ASSIGN_OR_RETURN(const size_t n, ReadBlock(fd.get(), block, shown));
    if (n == 0) break;
    // Checked while reading too: a pipe, or a file that grew after fstat.
    total += n;
    if (total > options.max_bytes)
      return TooLarge(shown, options.max_bytes, false, options.max_bytes);
    absl::string_view bytes(block.data(), n);
    // Editors on Windows start UTF-8 files with a BOM; it is not part of the first name.
    if (first && absl::StartsWith(bytes, kUtf8Bom)) bytes.remove_prefix(kUtf8Bom.size());
    SHOAL_RETURN_IF_ERROR(feeder.Feed(bytes));
  }
  SHOAL_RETURN_IF_ERROR(feeder.Finish());
  return std::move(builder).Finish();
}

absl::StatusOr<Standardization> ComputeStandardization(const Dataset& data) {
  SHOAL_ASSIGN_OR_RETURN(const size_t size, CheckShape(data));
  if (data.count == 0) {
    return absl::InvalidArgumentError("standardization: the data set has no samples");
  }
  const size_t n = data.FeatureCount();
  const size_t per = data.ValuesPerFeature();
  const double values = static_cast<double>(data.count) * static_cast<double>(per);
  // Two passes in double: the textbook one-pass sum of squares loses the variance to
  // cancellation when the mean is large next to the spread.
  std::vector<double> mean(n, 0.0);
  for (size_t i = 0; i < data.count; ++i) {
    const float* row = data.values.data() + i * size;
    for (size_t j = 0; j < n; ++j) {
      for (size_t k = 0; k < per; ++k) mean[j] += row[j * per + k];
    }
  }
  for (double& m : mean) m /= values;
  std::vector<double> var(n, 0.0);
  for (size_t i = 0; i < data.count; ++i) {
    const float* row = data.values.data() + i * size;
    for (size_t j = 0; j < n; ++j) {
      for (size_t k = 0; k < per; ++k) {
        const double d = row[j * per + k] - mean[j];
        var[j] += d * d;
      }
    }
  }
  Standardization s;
  s.mean.resize(n);
  s.stddev.resize(n);
  for (size_t j = 0; j < n; ++j) {
    const float m = static_cast<float>(mean[j]);
    const float sd = static_cast<float>(std::sqrt(var[j] / values));
    if (!std::isfinite(m) || !std::isfinite(sd)) {
      return absl::InvalidArgumentError(
          absl::StrCat("standardization: ", FeatureName(data, j),
                       " has a mean or standard deviation that is not a finite float"));
    }
    s.mean[j] = m;
    // A constant feature carries no information; stddev 1 maps it to 0 instead of NaN.
    s.stddev[j] = sd > 0.0f ? sd : 1.0f;
  }
  return s;
}

absl::Status CheckStandardization(const Standardization& s, const Dataset& data) {
  SHOAL_ASSIGN_OR_RETURN(const size_t size, CheckShape(data));
  const size_t n = data.FeatureCount();
  const size_t per = data.ValuesPerFeature();
  if (s.mean.size() != n || s.stddev.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("standardization: ", s.mean.size(),
                                                   " means and ", s.stddev.size(),
                                                   " standard deviations for a data set with ", n,
                                                   data.IsImage() ? " channels" : " features"));
  }
  for (size_t j = 0; j < n; ++j) {
    if (!std::isfinite(s.mean[j]) || !std::isfinite(s.stddev[j]) || !(s.stddev[j] > 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "standardization: ", FeatureName(data, j), ": mean ", s.mean[j], " and stddev ",
          s.stddev[j], " (the mean must be finite, the stddev finite and above 0)"));
    }
  }
  // The statistics of another split can map a value past float's range.
  for (size_t i = 0; i < data.count; ++i) {
    const float* row = data.values.data() + i * size;
    for (size_t j = 0; j < n; ++j) {
      for (const float* x = row + j * per; x != row + (j + 1) * per; ++x) {
        const double v = Standardized(s, *x, j);
        if (std::fabs(v) > std::numeric_limits<float>::max()) {
          return absl::InvalidArgumentError(
              absl::StrCat("standardization: sample ", i, ", ", FeatureName(data, j), ": ", *x,
                           " standardises to ", v, " (mean ", s.mean[j], ", stddev ", s.stddev[j],
                           "), outside float's range"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyStandardization(const Standardization& s, Dataset& data) {
  // Every value is checked before any is written, so that `data` stays unchanged on error.
  SHOAL_RETURN_IF_ERROR(CheckStandardization(s, data));
  const size_t size = data.SampleSize();
  const size_t per = data.ValuesPerFeature();
  for (size_t i = 0; i < data.count; ++i) {
    float* row = data.values.data() + i * size;
    for (size_t j = 0; j < s.mean.size(); ++j) {
      for (float* x = row + j * per; x != row + (j + 1) * per; ++x) {
        *x = static_cast<float>(Standardized(s, *x, j));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shoal::data
