// libs/data/csv_dataset: CSV tables into a Dataset (quoting, line ends, BOM, blank lines), every
// error with its code and the file:line and column it names, and standardization.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/data/csv_dataset.h"

namespace shoal::data {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pointwise;
using ::testing::StartsWith;

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("shoal-csv-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string file = (path_ / name).string();
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  std::string Path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

CsvOptions Label(const std::string& column) {
  CsvOptions options;
  options.label_column = column;
  return options;
}

std::string M(const absl::Status& status) { return std::string(status.message()); }

// Loads `text` as f.csv and expects INVALID_ARGUMENT; returns the message.
std::string LoadError(const TempDir& dir, const std::string& text, const CsvOptions& options) {
  const auto data = LoadCsv(dir.Write("f.csv", text), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  return M(data.status());
}

TEST(CsvLoadTest, IntegerLabels) {
  TempDir dir;
  const auto data = LoadCsv(dir.Write("f.csv", "a,b,label\n1,2,0\n3.5, -4e1 ,2\n  0.25\t,+7,1\n"),
                            Label("label"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 3u);
  EXPECT_THAT(data->sample_shape, ElementsAre(2));
  EXPECT_THAT(data->values, ElementsAre(1.0f, 2.0f, 3.5f, -40.0f, 0.25f, 7.0f));
  EXPECT_THAT(data->labels, ElementsAre(0u, 2u, 1u));
  EXPECT_THAT(data->class_names, ElementsAre("0", "1", "2"));
  EXPECT_THAT(data->feature_names, ElementsAre("a", "b"));
}

TEST(CsvLoadTest, NumClassesSetsTheClassNames) {
  TempDir dir;
  CsvOptions options = Label("y");
  options.num_classes = 4;
  const auto data = LoadCsv(dir.Write("f.csv", "y,x\n1,0.5\n"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->class_names, ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(data->labels, ElementsAre(1u));
  EXPECT_THAT(data->feature_names, ElementsAre("x"));
}

TEST(CsvLoadTest, StringLabelsTakeTheirIndexInClasses) {
  TempDir dir;
  CsvOptions options = Label("species");
  options.classes = {"setosa", "versicolor", "virginica"};
  const auto data = LoadCsv(
      dir.Write("f.csv", "x,species\n1,virginica\n2,setosa\n3, versicolor \n4,\"virginica\"\n"),
      options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels, ElementsAre(2u, 0u, 1u, 2u));
  EXPECT_THAT(data->class_names, ElementsAre("setosa", "versicolor", "virginica"));
}

TEST(CsvLoadTest, FeatureColumnsPickASubsetInTheirOrder) {
  TempDir dir;
  CsvOptions options = Label("label");
  options.feature_columns = {"c", "a"};
  const auto data = LoadCsv(dir.Write("f.csv", "a,b,label,c\n1,not used,0,3\n4,,1,6\n"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->sample_shape, ElementsAre(2));
  EXPECT_THAT(data->feature_names, ElementsAre("c", "a"));
  EXPECT_THAT(data->values, ElementsAre(3.0f, 1.0f, 6.0f, 4.0f));
}

TEST(CsvLoadTest, QuotedFieldsWithCommasQuotesAndNewlines) {
  TempDir dir;
  CsvOptions options = Label("label");
  options.feature_columns = {"x"};
  const auto data = LoadCsv(dir.Write("f.csv",
                                      "name,x,label\n"
                                      "\"Smith, John\",\"2.5\",\"1\"\n"
                                      "\"say \"\"hi\"\"\", 3 ,0\n"
                                      "\"two\nlines\",4,1\n"),
                            options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->values, ElementsAre(2.5f, 3.0f, 4.0f));
  EXPECT_THAT(data->labels, ElementsAre(1u, 0u, 1u));
}

TEST(CsvLoadTest, CrlfLineEnds) {
  TempDir dir;
  const auto data = LoadCsv(dir.Write("f.csv", "a,label\r\n1,0\r\n2,1\r\n"), Label("label"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->values, ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(data->labels, ElementsAre(0u, 1u));
  // Line numbers count CRLF lines like LF ones.
  EXPECT_THAT(LoadError(dir, "a,label\r\n1,0\r\nx,1\r\n", Label("label")),
              StartsWith(dir.Path("f.csv") + ":3: "));
}

TEST(CsvLoadTest, ByteOrderMarkIsDropped) {
  TempDir dir;
  // Without the BOM dropped, the first name would be "\xEF\xBB\xBFy" and "y" would be missing.
  const auto data = LoadCsv(dir.Write("f.csv",
                                      "\xEF\xBB\xBF"
                                      "y,a\n1,0.5\n"),
                            Label("y"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->feature_names, ElementsAre("a"));
  EXPECT_THAT(data->labels, ElementsAre(1u));
}

TEST(CsvLoadTest, BlankLinesAreSkippedAndLinesStillCounted) {
  TempDir dir;
  const auto data = LoadCsv(dir.Write("f.csv", "\na,label\n\n1,0\n   \n2,1\n\n\n"), Label("label"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 2u);
  EXPECT_THAT(LoadError(dir, "a,label\n\n\n1,0\n\nbad,1\n", Label("label")),
              StartsWith(dir.Path("f.csv") + ":6: column \"a\": \"bad\""));
}

TEST(CsvLoadTest, LastRowWithoutLineEnd) {
  TempDir dir;
  const auto data = LoadCsv(dir.Write("f.csv", "a,label\n1,0\n2,1"), Label("label"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->values, ElementsAre(1.0f, 2.0f));
}

TEST(CsvLoadTest, LineNumbersAfterAQuotedNewline) {
  TempDir dir;
  CsvOptions options = Label("label");
  options.feature_columns = {"x"};
  const std::string text = "name,x,label\n\"a\nb\nc\",1,0\nname,oops,1\n";
  EXPECT_THAT(LoadError(dir, text, options),
              StartsWith(dir.Path("f.csv") + ":5: column \"x\": \"oops\" is not a number"));
  // An error in the multi-line row names the line it starts on.
  EXPECT_THAT(LoadError(dir, "name,x,label\nok,1,0\n\"a\nb\",zz,1\n", options),
              StartsWith(dir.Path("f.csv") + ":3: column \"x\""));
}

TEST(CsvLoadTest, FiftyThousandRows) {
  TempDir dir;
  std::string text = "f0,f1,label\n";
  for (int i = 0; i < 50'000; ++i) absl::StrAppend(&text, i, ",", i * 0.5, ",", i % 3, "\n");
  const auto data = LoadCsv(dir.Write("big.csv", text), Label("label"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 50'000u);
  ASSERT_EQ(data->values.size(), 100'000u);
  EXPECT_EQ(data->values[2 * 49'999], 49'999.0f);
  EXPECT_EQ(data->values[2 * 49'999 + 1], 24'999.5f);
  EXPECT_EQ(data->labels[49'999], 49'999u % 3);
  EXPECT_THAT(data->class_names, ElementsAre("0", "1", "2"));
}

// Over 2 MiB: read in several blocks (a regular file's block is its size, capped at 1 MiB), with
// rows and a quoted cell across the block ends.
TEST(CsvLoadTest, RowsAcrossReadBlocks) {
  TempDir dir;
  std::string text = "name,f0,label\n";
  for (int i = 0; i < 100'000; ++i) {
    absl::StrAppend(&text, "\"row ", i, ",\nsecond line\",", i, ",", i % 2, "\n");
  }
  ASSERT_GT(text.size(), size_t{2} << 20);
  CsvOptions options = Label("label");
  options.feature_columns = {"f0"};
  const auto data = LoadCsv(dir.Write("big.csv", text), options);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->count, 100'000u);
  for (size_t i = 0; i < data->count; ++i) {
    ASSERT_EQ(data->values[i], static_cast<float>(i)) << "row " << i;
    ASSERT_EQ(data->labels[i], i % 2) << "row " << i;
  }
}

// A pipe has no size to fit the block to; it is read like a file.
TEST(CsvLoadTest, ReadsFromAPipe) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string text = "f0,label\n1.5,0\n2.5,1\n";
  ASSERT_EQ(::write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fds[1]);
  const auto data = LoadCsv(absl::StrCat("/proc/self/fd/", fds[0]), Label("label"));
  ::close(fds[0]);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->values, ElementsAre(1.5f, 2.5f));
  EXPECT_THAT(data->labels, ElementsAre(0u, 1u));
}

TEST(CsvErrorTest, MissingFileIsNotFound) {
  TempDir dir;
  const auto data = LoadCsv(dir.Path("nope.csv"), Label("y"));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(M(data.status()), StartsWith(dir.Path("nope.csv") + ": "));
}

TEST(CsvErrorTest, DirectoryIsRefused) {
  TempDir dir;
  std::filesystem::create_directory(dir.Path("d.csv"));
  const auto data = LoadCsv(dir.Path("d.csv"), Label("y"));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(M(data.status()),
              AllOf(StartsWith(dir.Path("d.csv") + ": "), HasSubstr("is a directory")));
}

TEST(CsvErrorTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  TempDir dir;
  const std::string file = dir.Write("f.csv", "a,y\n1,0\n");
  ::chmod(file.c_str(), 0);
  const auto data = LoadCsv(file, Label("y"));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(M(data.status()), StartsWith(file + ": "));
}

TEST(CsvErrorTest, FileOverMaxBytesIsRefused) {
  TempDir dir;
  CsvOptions options = Label("y");
  options.max_bytes = 8;
  EXPECT_THAT(LoadError(dir, "a,y\n1,0\n2,1\n", options),
              AllOf(StartsWith(dir.Path("f.csv") + ": "), HasSubstr("over the limit of 8 bytes")));
}

TEST(CsvErrorTest, EmptyFileAndHeaderOnly) {
  TempDir dir;
  EXPECT_THAT(LoadError(dir, "", Label("y")),
              AllOf(StartsWith(dir.Path("f.csv") + ": "), HasSubstr("empty")));
  EXPECT_THAT(LoadError(dir, "\n  \n\n", Label("y")), HasSubstr("empty"));
  EXPECT_THAT(
      LoadError(dir, "a,y\n\n", Label("y")),
      AllOf(StartsWith(dir.Path("f.csv") + ":1: "), HasSubstr("not followed by any data rows")));
}

TEST(CsvErrorTest, DuplicateHeaderName) {
  TempDir dir;
  EXPECT_THAT(LoadError(dir, "a,y,a\n1,0,2\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":1: duplicate column name \"a\" (columns 1 and 3)"));
}

TEST(CsvErrorTest, MissingColumnsListTheHeader) {
  TempDir dir;
  EXPECT_THAT(LoadError(dir, "a,b\n1,0\n", Label("label")),
              AllOf(StartsWith(dir.Path("f.csv") + ":1: label column \"label\" is not in the "),
                    HasSubstr("(columns: \"a\", \"b\")")));
  CsvOptions options = Label("b");
  options.feature_columns = {"a", "c"};
  EXPECT_THAT(LoadError(dir, "a,b\n1,0\n", options),
              AllOf(StartsWith(dir.Path("f.csv") + ":1: feature column \"c\""),
                    HasSubstr("(columns: \"a\", \"b\")")));
  // A wide header is shortened.
  std::string header;
  for (int i = 0; i < 40; ++i) absl::StrAppend(&header, i == 0 ? "" : ",", "col", i);
  const std::string msg = LoadError(dir, header + "\n", Label("label"));
  EXPECT_THAT(msg, AllOf(HasSubstr("\"col15\", ... and 24 more)"), Not(HasSubstr("col16"))));
}

TEST(CsvErrorTest, OnlyTheLabelColumn) {
  TempDir dir;
  EXPECT_THAT(LoadError(dir, "y\n1\n", Label("y")),
              AllOf(StartsWith(dir.Path("f.csv") + ":1: "), HasSubstr("no feature columns")));
}

TEST(CsvErrorTest, RaggedRows) {
  TempDir dir;
  EXPECT_THAT(LoadError(dir, "a,b,y\n1,2,0\n3,1\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":3: the row has 2 cells, expected 3"));
  // Too many cells, and a bad value in the ragged row: the count is what is wrong.
  EXPECT_THAT(LoadError(dir, "a,b,y\n1,2,0\nx,2,1,9\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":3: the row has 4 cells, expected 3"));
}

TEST(CsvErrorTest, BadFeatureCellsNameLineColumnAndValue) {
  TempDir dir;
  const std::string at = dir.Path("f.csv") + ":3: column \"age\": ";
  const auto error = [&](const std::string& cell) {
    return LoadError(dir, "age,y\n1,0\n" + cell + ",1\n", Label("y"));
  };
  EXPECT_THAT(error("abc"), StartsWith(at + "\"abc\" is not a number"));
  EXPECT_THAT(error(""), StartsWith(at + "\"\" is empty"));
  EXPECT_THAT(error("\"  \""), StartsWith(at + "\"  \" is empty"));
  EXPECT_THAT(error("nan"), StartsWith(at + "\"nan\" is not a finite number"));
  EXPECT_THAT(error("-inf"), StartsWith(at + "\"-inf\" is not a finite number"));
  EXPECT_THAT(error("1e999"), StartsWith(at + "\"1e999\" is not a finite number"));
  EXPECT_THAT(error("1.5x"), StartsWith(at + "\"1.5x\" is not a number"));
  // Control bytes are escaped; long values are cut.
  const std::string msg = error("\"a\x01\x1b[2Jb\"");
  EXPECT_THAT(msg, HasSubstr("\"a\\x01\\x1b[2Jb\""));
  EXPECT_EQ(msg.find('\x1b'), std::string::npos);
  EXPECT_THAT(error(std::string(500, '7') + "x"),
              AllOf(HasSubstr("\"" + std::string(40, '7') + "...\""),
                    Not(HasSubstr(std::string(41, '7')))));
}

TEST(CsvErrorTest, BadIntegerLabels) {
  TempDir dir;
  const std::string at = dir.Path("f.csv") + ":2: column \"y\": ";
  for (const char* label : {"-1", "1.0", "x", "", "+2"}) {
    EXPECT_THAT(LoadError(dir, absl::StrCat("a,y\n1,", label, "\n"), Label("y")),
                StartsWith(at + "\"" + label + "\" is not a class label"))
        << label;
  }
  EXPECT_THAT(LoadError(dir, "a,y\n1,99999999999\n", Label("y")),
              StartsWith(at + "\"99999999999\" is over the limit"));
  CsvOptions options = Label("y");
  options.num_classes = 3;
  EXPECT_THAT(LoadError(dir, "a,y\n1,3\n", options),
              StartsWith(at + "\"3\" is not below num_classes (3)"));
}

TEST(CsvErrorTest, LabelNotInClassesNamesTheClasses) {
  TempDir dir;
  CsvOptions options = Label("y");
  options.classes = {"cat", "dog"};
  EXPECT_THAT(LoadError(dir, "a,y\n1,cat\n2,cow\n", options),
              StartsWith(dir.Path("f.csv") +
                         ":3: column \"y\": \"cow\" is not one of the classes \"cat\", \"dog\""));
}

TEST(CsvErrorTest, MalformedQuoting) {
  TempDir dir;
  EXPECT_THAT(LoadError(dir, "a,y\n1,0\n2\"x\",1\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":3: malformed quoting"));
  EXPECT_THAT(LoadError(dir, "a,y\n1,0\n\"2\"x,1\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":3: malformed quoting"));
  // A quote that is never closed would swallow the rest of the file.
  EXPECT_THAT(LoadError(dir, "a,y\n1,0\n2,\"1\n3,0\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":3: the file ends inside a quoted cell"));
  EXPECT_THAT(LoadError(dir, "a,y\n1,0\n\"2,1\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ": the file ends inside a quoted cell that starts "
                                             "after line 2"));
}

TEST(CsvErrorTest, Caps) {
  TempDir dir;
  std::string header = "y";
  for (size_t i = 0; i < kMaxCsvColumns; ++i) absl::StrAppend(&header, ",c", i);
  EXPECT_THAT(LoadError(dir, header + "\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":1: the header has more than 100000 columns"));
  const std::string long_cell = "\"" + std::string(kMaxCsvCellBytes + 10, 'x') + "\"";
  EXPECT_THAT(LoadError(dir, "a,y\n1,0\n" + long_cell + ",1\n", Label("y")),
              StartsWith(dir.Path("f.csv") + ":3: a cell is longer than the limit"));
}

TEST(CsvErrorTest, BadOptions) {
  TempDir dir;
  const std::string file = dir.Write("f.csv", "a,y\n1,0\n");
  EXPECT_EQ(LoadCsv(file, CsvOptions{}).status().code(), absl::StatusCode::kInvalidArgument);
  CsvOptions options = Label("y");
  options.feature_columns = {"a", "y"};
  const auto data = LoadCsv(file, options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(M(data.status()), AllOf(StartsWith(file + ": "), HasSubstr("label column \"y\"")));
  options = Label("y");
  options.classes = {"a", "b"};
  options.num_classes = 3;
  EXPECT_EQ(LoadCsv(file, options).status().code(), absl::StatusCode::kInvalidArgument);
}

Dataset Table(size_t features, std::vector<float> values) {
  Dataset data;
  data.sample_shape = {static_cast<int64_t>(features)};
  data.count = values.size() / features;
  data.values = std::move(values);
  data.labels.assign(data.count, 0);
  data.class_names = {"0"};
  return data;
}

TEST(StandardizationTest, HandComputedValues) {
  // Feature 0: 1, 2, 3, 4 -> mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  // Feature 1: -2, 0, 2, 8 -> mean 2, variance (16 + 4 + 0 + 36) / 4 = 14.
  Dataset data = Table(2, {1, -2, 2, 0, 3, 2, 4, 8});
  const auto s = ComputeStandardization(data);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->mean, Pointwise(FloatNear(1e-6), std::vector<float>{2.5f, 2.0f}));
  const float sd0 = std::sqrt(1.25f);
  const float sd1 = std::sqrt(14.0f);
  EXPECT_THAT(s->stddev, Pointwise(FloatNear(1e-6), std::vector<float>{sd0, sd1}));
  ASSERT_TRUE(ApplyStandardization(*s, data).ok());
  EXPECT_THAT(
      data.values,
      Pointwise(FloatNear(1e-5), std::vector<float>{-1.5f / sd0, -4 / sd1, -0.5f / sd0, -2 / sd1,
                                                    0.5f / sd0, 0, 1.5f / sd0, 6 / sd1}));
}

TEST(StandardizationTest, ConstantFeatureMapsToZero) {
  Dataset data = Table(2, {7, 1, 7, 3});
  const auto s = ComputeStandardization(data);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->mean, ElementsAre(7.0f, 2.0f));
  EXPECT_THAT(s->stddev, ElementsAre(1.0f, 1.0f));
  ASSERT_TRUE(ApplyStandardization(*s, data).ok());
  EXPECT_THAT(data.values, ElementsAre(0.0f, -1.0f, 0.0f, 1.0f));
}

TEST(StandardizationTest, Errors) {
  Dataset data = Table(2, {1, 2, 3, 4});
  const auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_EQ(code(ApplyStandardization({{0}, {1}}, data)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ApplyStandardization({{0, 0}, {1, 0}}, data)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ApplyStandardization({{0, 0}, {1, NAN}}, data)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ApplyStandardization({{0, INFINITY}, {1, 1}}, data)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.values, ElementsAre(1.0f, 2.0f, 3.0f, 4.0f));  // unchanged
  EXPECT_EQ(code(ComputeStandardization(Table(2, {})).status()),
            absl::StatusCode::kInvalidArgument);
  Dataset ragged = Table(2, {1, 2, 3, 4});
  ragged.values.pop_back();
  EXPECT_EQ(code(ComputeStandardization(ragged).status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ComputeStandardization(Table(1, {1, INFINITY})).status()),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::data
