#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "libs/data/idx_dataset.h"

namespace shoal::data {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint8_t kU8 = 0x08, kI8 = 0x09, kI16 = 0x0B, kI32 = 0x0C, kF32 = 0x0D, kF64 = 0x0E;

void PutBigEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// An IDX file's bytes: the header for `type` and `dims`, then `data` (already big-endian).
std::string Idx(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) PutBigEndian(out, d, 4);
  return out + data;
}

std::string Bytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::string Ints(const std::vector<int64_t>& v, int bytes) {
  std::string out;
  for (int64_t x : v) PutBigEndian(out, static_cast<uint64_t>(x), bytes);
  return out;
}

std::string Floats(const std::vector<float>& v) {
  std::string out;
  for (float x : v) PutBigEndian(out, std::bit_cast<uint32_t>(x), 4);
  return out;
}

std::string Doubles(const std::vector<double>& v) {
  std::string out;
  for (double x : v) PutBigEndian(out, std::bit_cast<uint64_t>(x), 8);
  return out;
}

// Writes IDX files (plain or gzip) under a fresh temp directory, removed afterwards.
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/idx_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (root_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string WriteGzip(const std::string& name, const std::string& bytes) {
    const std::string path = (root_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }
  std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Three 2x2 uint8 images and their labels, plain.
  std::string images() { return Write("images.idx", Idx(kU8, {3, 2, 2}, Bytes(kPixels))); }
  std::string labels() { return Write("labels.idx", Idx(kU8, {3}, Bytes({2, 0, 1}))); }

  const std::vector<uint8_t> kPixels = {0, 255, 51, 102, 1, 2, 3, 4, 200, 100, 50, 25};
  fs::path root_;
};

std::vector<float> Scaled(const std::vector<uint8_t>& pixels) {
  std::vector<float> out;
  for (uint8_t p : pixels) out.push_back(static_cast<float>(p) / 255.0f);
  return out;
}

TEST_F(IdxTest, Uint8ImagesAreScaledExactly) {
  absl::StatusOr<Dataset> d = LoadIdx(images(), labels(), {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 3u);
  EXPECT_THAT(d->sample_shape, ElementsAre(1, 2, 2));
  EXPECT_EQ(d->values, Scaled(kPixels));
  EXPECT_EQ(d->values[1], 1.0f);
  EXPECT_THAT(d->labels, ElementsAre(2, 0, 1));
  EXPECT_THAT(d->class_names, ElementsAre("0", "1", "2"));
  EXPECT_TRUE(d->feature_names.empty());
}

TEST_F(IdxTest, GzipIsDetectedByContentNotName) {
  // Compressed under a plain name, plain under a .gz name: both load the same.
  const std::string gz_images = WriteGzip("images.idx", Idx(kU8, {3, 2, 2}, Bytes(kPixels)));
  const std::string plain_labels = Write("labels.gz", Idx(kU8, {3}, Bytes({2, 0, 1})));
  absl::StatusOr<Dataset> d = LoadIdx(gz_images, plain_labels, {});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(static_cast<uint8_t>(ReadAll(gz_images)[0]), 0x1f);
  EXPECT_EQ(d->values, Scaled(kPixels));
  EXPECT_THAT(d->labels, ElementsAre(2, 0, 1));
}

TEST_F(IdxTest, Float32TableWithNamedClasses) {
  const std::vector<float> values = {1.5f, -2.25f, 1e-7f, 3e6f, 0.0f, -0.0f};
  const std::string x = WriteGzip("x.idx.gz", Idx(kF32, {3, 2}, Floats(values)));
  const std::string y = Write("y.idx", Idx(kI32, {3}, Ints({1, 1, 0}, 4)));
  IdxOptions options;
  options.classes = {"cold", "hot"};
  absl::StatusOr<Dataset> d = LoadIdx(x, y, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 3u);
  EXPECT_THAT(d->sample_shape, ElementsAre(2));
  EXPECT_EQ(d->values, values);
  EXPECT_THAT(d->labels, ElementsAre(1, 1, 0));
  EXPECT_THAT(d->class_names, ElementsAre("cold", "hot"));
}

TEST_F(IdxTest, OtherTypesAndShapes) {
  // int16 samples of 2x1x2: a shape of 3 dimensions is kept as it is.
  const std::string x16 =
      Write("x16", Idx(kI16, {2, 2, 1, 2}, Ints({-32768, -1, 0, 7, 32767, 300, 5, -5}, 2)));
  const std::string y = Write("y", Idx(kI16, {2}, Ints({0, 3}, 2)));
  absl::StatusOr<Dataset> d = LoadIdx(x16, y, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->sample_shape, ElementsAre(2, 1, 2));
  EXPECT_THAT(d->values, ElementsAre(-32768, -1, 0, 7, 32767, 300, 5, -5));
  EXPECT_THAT(d->class_names, ElementsAre("0", "1", "2", "3"));

  // int8 is signed; float64 is narrowed; a 1-D file is one scalar per sample.
  const std::string x8 = Write("x8", Idx(kI8, {2}, Bytes({0xFF, 0x7F})));
  const std::string y8 = Write("y8", Idx(kI8, {2}, Bytes({1, 0})));
  d = LoadIdx(x8, y8, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->sample_shape, ElementsAre(1));
  EXPECT_THAT(d->values, ElementsAre(-1, 127));

  const std::string x64 = Write("x64", Idx(kF64, {2, 1}, Doubles({0.1, -1e30})));
  d = LoadIdx(x64, y8, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->values, ElementsAre(0.1f, -1e30f));
}

TEST_F(IdxTest, NumClassesSetsTheClassCount) {
  IdxOptions options;
  options.num_classes = 5;
  absl::StatusOr<Dataset> d = LoadIdx(images(), labels(), options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->class_names, ElementsAre("0", "1", "2", "3", "4"));

  options.num_classes = 2;  // label 2 of sample 0 is past it
  d = LoadIdx(images(), labels(), options);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()),
              AllOf(StartsWith(labels()), HasSubstr("label 2 of sample 0")));

  // Class names fix the class count even when the data lack the last class.
  options.num_classes = 0;
  options.classes = {"a", "b", "c", "d"};
  d = LoadIdx(images(), labels(), options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->class_names, ElementsAre("a", "b", "c", "d"));
  options.classes = {"a", "b"};
  d = LoadIdx(images(), labels(), options);
  EXPECT_THAT(std::string(d.status().message()),
              AllOf(StartsWith(labels()), HasSubstr("label 2 of sample 0")));

  options.num_classes = 3;  // contradicts the two names
  d = LoadIdx(images(), labels(), options);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("num_classes 3 does not match the 2 classes"));
}

TEST_F(IdxTest, FashionMnistTestSet) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << "no " << dir;
  IdxOptions options;
  options.num_classes = 10;
  absl::StatusOr<Dataset> d =
      LoadIdx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz", options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 10000u);
  EXPECT_THAT(d->sample_shape, ElementsAre(1, 28, 28));
  ASSERT_EQ(d->values.size(), 10000u * 784);
  ASSERT_EQ(d->labels.size(), 10000u);
  EXPECT_EQ(d->class_names.size(), 10u);
  std::vector<int> per_class(10);
  for (uint32_t l : d->labels) ++per_class[l];
  EXPECT_THAT(per_class, ::testing::Each(1000));
  float lo = 1, hi = 0;
  for (float v : d->values) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
}

// The error's code, and its message starting with `path` and holding every one of `parts`.
void ExpectError(const absl::StatusOr<Dataset>& d, absl::StatusCode code, const std::string& path,
                 std::vector<std::string> parts) {
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), code) << d.status();
  EXPECT_THAT(std::string(d.status().message()), StartsWith(path + ": "));
  for (const std::string& part : parts) EXPECT_THAT(d.status().message(), HasSubstr(part));
}

TEST_F(IdxTest, MissingFilesAndDirectories) {
  const std::string missing = (root_ / "nope.idx").string();
  ExpectError(LoadIdx(missing, labels(), {}), absl::StatusCode::kNotFound, missing, {"open"});
  ExpectError(LoadIdx(images(), missing, {}), absl::StatusCode::kNotFound, missing, {});
  ExpectError(LoadIdx(root_.string(), labels(), {}), absl::StatusCode::kInvalidArgument,
              root_.string(), {"directory"});
}

TEST_F(IdxTest, BadHeaders) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  std::string p = Write("magic", "P5\n2 2\n255\n....");
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"bad magic 50350a32", "not an IDX file"});
  p = Write("type", Idx(0x0A, {1}, "x"));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"unsupported IDX element type 0x0a"});
  p = Write("nodims", Idx(kU8, {}, ""));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"0 dimensions"});
  p = Write("zerodim", Idx(kU8, {3, 0, 2}, ""));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"dimension 1 of uint8 [3, 0, 2] is 0"});
  p = Write("overflow", Idx(kF64, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, ""));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"more bytes than 64 bits count", "limit"});
  p = Write("huge", Idx(kU8, {100000, 1000, 1000}, ""));  // 10^11 bytes > 8 GiB
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"100000000016 bytes", "over the limit"});
  IdxOptions small;
  small.max_bytes = 20;  // the 28-byte images file is over it
  ExpectError(LoadIdx(images(), labels(), small), bad, images(), {"28 bytes", "limit of 20"});
  p = Write("empty", "");
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"expected 4 magic bytes, found 0"});
  p = Write("shortdims", Idx(kU8, {3, 2, 2}, "").substr(0, 10));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"expected 16 bytes for 3 dimensions, found 10"});
}

TEST_F(IdxTest, TruncatedAndTrailingData) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  const std::string whole = Idx(kU8, {3, 2, 2}, Bytes(kPixels));
  std::string p = Write("short", whole.substr(0, whole.size() - 2));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"truncated", "12 data bytes, found 10"});
  p = WriteGzip("short.gz", whole.substr(0, whole.size() - 2));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"12 data bytes, found 10"});
  p = Write("trailing", whole + "xyz");
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"3 bytes follow the 12 data bytes"});
  p = WriteGzip("trailing.gz", whole + "xyz");
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"3 bytes follow"});

  // A gzip file cut off mid-stream, and one with damaged compressed data.
  std::string big;
  for (int i = 0; i < 20000; ++i) big.push_back(static_cast<char>((i * 7919) % 251));
  const std::string gz = ReadAll(WriteGzip("big.gz", Idx(kU8, {20000}, big)));
  const std::string labels20k = Write("labels20k", Idx(kU8, {20000}, std::string(20000, '\0')));
  p = Write("cut.gz", gz.substr(0, gz.size() / 2));
  ExpectError(LoadIdx(p, labels20k, {}), bad, p, {"20000 data bytes, found", "ends early"});
  std::string damaged = gz;
  for (size_t i = 20; i < 60; ++i) damaged[i] = static_cast<char>(~damaged[i]);
  p = Write("damaged.gz", damaged);
  ExpectError(LoadIdx(p, labels20k, {}), bad, p, {"corrupt gzip data"});
}

TEST_F(IdxTest, NonFiniteValuesNameTheSample) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string p = Write("nan", Idx(kF32, {3, 2}, Floats({0, 1, 2, 3, 4, nan})));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"sample 2", "not a finite number"});
  p = Write("inf", Idx(kF64, {3, 1}, Doubles({0, -INFINITY, 1})));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"sample 1", "not a finite number"});
  p = Write("range", Idx(kF64, {3, 1}, Doubles({1e300, 0, 1})));
  ExpectError(LoadIdx(p, labels(), {}), bad, p, {"sample 0", "outside float32's range"});
}

TEST_F(IdxTest, BadLabels) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  std::string p = Write("count", Idx(kU8, {4}, Bytes({0, 1, 2, 0})));
  ExpectError(LoadIdx(images(), p, {}), bad, p, {"4 labels for the 3 samples of " + images()});
  p = Write("neg", Idx(kI8, {3}, Bytes({0, 0xFF, 1})));
  ExpectError(LoadIdx(images(), p, {}), bad, p, {"label -1 of sample 1 is negative"});
  p = Write("cap", Idx(kI32, {3}, Ints({0, 1, 100000}, 4)));
  ExpectError(LoadIdx(images(), p, {}), bad, p, {"label 100000 of sample 2", "100000 classes"});
  p = Write("float", Idx(kF32, {3}, Floats({0, 1, 2})));
  ExpectError(LoadIdx(images(), p, {}), bad, p, {"integers", "float32"});
  p = Write("2d", Idx(kU8, {3, 1}, Bytes({0, 1, 2})));
  ExpectError(LoadIdx(images(), p, {}), bad, p, {"2 dimensions"});
  p = Write("short", Idx(kU8, {3}, Bytes({0, 1})));
  ExpectError(LoadIdx(images(), p, {}), bad, p, {"3 data bytes, found 2"});
}

}  // namespace
}  // namespace shoal::data
