#include "libs/data/image_folder.h"

// The test writes its images with stb_image_write: libstb.so holds its implementation, only the
// declarations come from here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace shoal::data {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Writes image folders under a fresh temp directory, removed afterwards.
class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/image_folder_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = fs::path(tmpl) / "data";
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_.parent_path()); }

  // `pixels`: height x width x channels, interleaved. Returns the file's path.
  std::string WritePng(const std::string& rel, int width, int height, int channels,
                       const std::vector<uint8_t>& pixels) {
    const fs::path path = root_ / rel;
    fs::create_directories(path.parent_path());
    EXPECT_EQ(pixels.size(), size_t(width) * height * channels);
    EXPECT_NE(stbi_write_png(path.c_str(), width, height, channels, pixels.data(), 0), 0) << path;
    return path.string();
  }
  std::string WriteUniformPng(const std::string& rel, int side, int channels, uint8_t value) {
    return WritePng(rel, side, side, channels,
                    std::vector<uint8_t>(size_t(side) * side * channels, value));
  }
  std::string WriteJpeg(const std::string& rel, int side, uint8_t r, uint8_t g, uint8_t b) {
    const fs::path path = root_ / rel;
    fs::create_directories(path.parent_path());
    std::vector<uint8_t> pixels;
    for (int i = 0; i < side * side; ++i) pixels.insert(pixels.end(), {r, g, b});
    EXPECT_NE(stbi_write_jpg(path.c_str(), side, side, 3, pixels.data(), 95), 0) << path;
    return path.string();
  }
  std::string WriteText(const std::string& rel, const std::string& text) {
    const fs::path path = root_ / rel;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  std::string dir() const { return root_.string(); }

  fs::path root_;
};

ImageFolderOptions Gray(int side) {
  ImageFolderOptions options;
  options.height = side;
  options.width = side;
  options.channels = 1;
  return options;
}

ImageFolderOptions Rgb(int side) {
  ImageFolderOptions options = Gray(side);
  options.channels = 3;
  return options;
}

TEST_F(ImageFolderTest, TwoClassesInBytewiseOrderWithLabels) {
  // Written out of order: the loader sorts classes and files bytewise ("B" < "a" < "b").
  WriteUniformPng("b/2.png", 2, 1, 40);
  WriteUniformPng("b/1.png", 2, 1, 30);
  WriteUniformPng("a/x.png", 2, 1, 20);
  WriteUniformPng("B/z.png", 2, 1, 10);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Gray(2));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->class_names, ElementsAre("B", "a", "b"));
  EXPECT_THAT(data->sample_shape, ElementsAre(1, 2, 2));
  EXPECT_EQ(data->count, 4u);
  EXPECT_THAT(data->labels, ElementsAre(0, 1, 2, 2));
  ASSERT_EQ(data->values.size(), 16u);
  // Each file's constant pixel identifies it: B/z, a/x, b/1, b/2.
  const uint8_t expected[] = {10, 20, 30, 40};
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_FLOAT_EQ(data->values[i * 4 + j], expected[i] / 255.0f) << i << "," << j;
    }
  }
  EXPECT_TRUE(data->feature_names.empty());
}

TEST_F(ImageFolderTest, PixelsScaledAndNormalisedIntoPlanarChannels) {
  constexpr int kWidth = 3, kHeight = 2;
  std::vector<uint8_t> pixels;
  for (int i = 0; i < kWidth * kHeight; ++i) {
    pixels.insert(pixels.end(), {uint8_t(10 * i), uint8_t(255 - 7 * i), uint8_t(i == 0 ? 255 : 0)});
  }
  WritePng("only/img.png", kWidth, kHeight, 3, pixels);
  ImageFolderOptions options = Rgb(0);
  options.height = kHeight;
  options.width = kWidth;
  options.mean = {0.5f, 0.25f, 0.0f};
  options.std = {0.5f, 2.0f, 1.0f};
  absl::StatusOr<ImageFolderLoad> load = LoadImageFolderWithReport(dir(), options);
  ASSERT_TRUE(load.ok()) << load.status();
  const Dataset& data = load->dataset;
  EXPECT_THAT(data.sample_shape, ElementsAre(3, kHeight, kWidth));
  EXPECT_EQ(load->resized_images, 0u);
  ASSERT_EQ(data.values.size(), size_t(3 * kWidth * kHeight));
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < kWidth * kHeight; ++i) {
      const float expected = (pixels[i * 3 + c] / 255.0f - options.mean[c]) / options.std[c];
      EXPECT_FLOAT_EQ(data.values[c * kWidth * kHeight + i], expected) << c << "," << i;
    }
  }
  // Spot values worked by hand: red 0 -> (0 - 0.5) / 0.5; blue 255 at pixel 0 -> 1.
  EXPECT_FLOAT_EQ(data.values[0], -1.0f);
  EXPECT_FLOAT_EQ(data.values[2 * kWidth * kHeight], 1.0f);
  EXPECT_FLOAT_EQ(data.values[kWidth * kHeight], (1.0f - 0.25f) / 2.0f);
}

TEST_F(ImageFolderTest, ResizesToTheTaskSize) {
  std::vector<uint8_t> pixels;
  for (int i = 0; i < 8 * 8 * 3; ++i) pixels.push_back(uint8_t((i * 37) % 256));
  WritePng("c/big.png", 8, 8, 3, pixels);
  WriteUniformPng("c/small.png", 4, 3, 100);
  absl::StatusOr<ImageFolderLoad> load = LoadImageFolderWithReport(dir(), Rgb(4));
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_THAT(load->dataset.sample_shape, ElementsAre(3, 4, 4));
  EXPECT_EQ(load->dataset.count, 2u);
  EXPECT_EQ(load->resized_images, 1u);
  ASSERT_EQ(load->dataset.values.size(), 2u * 3 * 4 * 4);
  for (float v : load->dataset.values) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
}

TEST_F(ImageFolderTest, LoadsJpegWithAnyCaseExtension) {
  WriteJpeg("red/one.jpg", 8, 200, 30, 30);
  WriteJpeg("red/two.JPEG", 8, 200, 30, 30);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Rgb(8));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 2u);
  ASSERT_EQ(data->values.size(), 2u * 3 * 8 * 8);
  // JPEG is lossy: a flat colour comes back within a few levels.
  EXPECT_NEAR(data->values[0], 200 / 255.0f, 6 / 255.0f);
  EXPECT_NEAR(data->values[64], 30 / 255.0f, 6 / 255.0f);
}

fs::path SourceDir() {
  const char* source = std::getenv("SHOAL_SOURCE_DIR");
  return fs::path(source != nullptr ? source : ".");
}

// Progressive JPEGs (libjpeg-turbo's cjpeg -progressive) define each scan's Huffman tables just
// before the scan, only those it uses.
TEST_F(ImageFolderTest, LoadsProgressiveJpegs) {
  const fs::path images = SourceDir() / "tests/data/images";
  for (const auto& [file, channels] :
       {std::pair{"progressive-rgb.jpg", 3}, std::pair{"progressive-gray.jpg", 1}}) {
    const fs::path dir = root_ / file;
    fs::create_directories(dir / "c0");
    fs::copy_file(images / file, dir / "c0" / "x.jpg");
    ImageFolderOptions options;
    options.height = 12;
    options.width = 16;
    options.channels = channels;
    absl::StatusOr<Dataset> set = LoadImageFolder(dir, options);
    ASSERT_TRUE(set.ok()) << file << ": " << set.status();
    EXPECT_EQ(set->count, 1u) << file;
  }
}

// The image_folder fuzz seeds cover the variants a writer may choose: 16-bit and interlaced
// gray PNG, a 2-bit palette, JPEGs with restart markers, 4:4:4 sampling, optimised tables. Each
// seed is the options byte (bit 1: RGB) and then the file.
TEST_F(ImageFolderTest, LoadsEveryFuzzSeedImage) {
  const fs::path seeds = SourceDir() / "tests/fuzz/corpus/image_folder";
  int loaded = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(seeds)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(input.size(), 1u) << entry.path();
    const std::string name = entry.path().filename().string();
    const std::string path =
        WriteText(name + "/c0/x" + entry.path().extension().string(), input.substr(1));
    ImageFolderOptions options = (input[0] & 2) ? Rgb(8) : Gray(8);
    absl::StatusOr<ImageFolderLoad> load =
        LoadImageFolderWithReport((root_ / name).string(), options);
    ASSERT_TRUE(load.ok()) << path << ": " << load.status();
    EXPECT_EQ(load->dataset.count, 1u) << path;
    for (float v : load->dataset.values) {
      EXPECT_GE(v, 0.0f) << path;
      EXPECT_LE(v, 1.0f) << path;
    }
    ++loaded;
  }
  EXPECT_EQ(loaded, 8);
}

// A PNG whose data chunk claims more bytes than the file holds: refused by the decoder (and
// streamed, never allocated at the declared size).
TEST_F(ImageFolderTest, RefusesPngChunkLongerThanTheFile) {
  std::vector<uint8_t> noise;
  for (int i = 0; i < 16 * 16; ++i) noise.push_back(uint8_t((i * 7919) % 251));
  const std::string path = WritePng("a/long.png", 16, 16, 1, noise);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t idat = bytes.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  bytes.replace(idat - 4, 4, std::string("\x7f\xff\xff\xff", 4));  // 2^31 - 1 bytes
  WriteText("a/long.png", bytes);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Gray(16));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(path), HasSubstr("corrupt or truncated PNG image: ")));
}

TEST_F(ImageFolderTest, RefusesGrayscaleImageInRgbTask) {
  const std::string path = WriteUniformPng("a/gray.png", 4, 1, 50);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Rgb(4));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(path), HasSubstr("1 channel"), HasSubstr("expects 3 channels")));
}

TEST_F(ImageFolderTest, RefusesRgbImageInGrayscaleTask) {
  const std::string path = WriteJpeg("a/colour.jpg", 4, 1, 2, 3);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Gray(4));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(path), HasSubstr("3 channels"), HasSubstr("expects 1 channel")));
}

TEST_F(ImageFolderTest, RefusesAlphaChannels) {
  const std::string rgba = WriteUniformPng("a/rgba.png", 4, 4, 9);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Rgb(4));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(rgba), HasSubstr("4 channels"), HasSubstr("alpha")));

  fs::remove(rgba);
  const std::string gray_alpha = WriteUniformPng("a/ga.png", 4, 2, 9);
  data = LoadImageFolder(dir(), Gray(4));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(gray_alpha), HasSubstr("2 channels"), HasSubstr("alpha")));
}

TEST_F(ImageFolderTest, RefusesTruncatedPngWithTheDecodersReason) {
  std::vector<uint8_t> noise;
  for (int i = 0; i < 32 * 32; ++i) noise.push_back(uint8_t((i * 7919) % 251));
  const std::string path = WritePng("a/cut.png", 32, 32, 1, noise);
  fs::resize_file(path, fs::file_size(path) / 2);
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Gray(32));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(path), HasSubstr("corrupt or truncated PNG image: ")));
  // The reason after the colon says what the decoder met.
  EXPECT_THAT(data.status().message(), HasSubstr("the file ends before the image does"));
}

TEST_F(ImageFolderTest, RefusesTextFileNamedPng) {
  WriteUniformPng("a/fine.png", 4, 1, 1);
  const std::string path = WriteText("a/notes.png", "hello, not an image\n");
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Gray(4));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), AllOf(HasSubstr(path), HasSubstr("not a PNG or JPEG")));
}

TEST_F(ImageFolderTest, ClassesOptionSetsLabelOrder) {
  WriteUniformPng("a/1.png", 2, 1, 10);
  WriteUniformPng("b/1.png", 2, 1, 20);
  ImageFolderOptions options = Gray(2);
  options.classes = {"b", "a"};
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->class_names, ElementsAre("b", "a"));
  EXPECT_THAT(data->labels, ElementsAre(0, 1));
  EXPECT_FLOAT_EQ(data->values[0], 20 / 255.0f);
  EXPECT_FLOAT_EQ(data->values[4], 10 / 255.0f);
}

TEST_F(ImageFolderTest, ClassesOptionMissingDirectoryIsNamed) {
  WriteUniformPng("a/1.png", 2, 1, 10);
  WriteUniformPng("b/1.png", 2, 1, 20);
  ImageFolderOptions options = Gray(2);
  options.classes = {"a", "b", "cat"};
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr((root_ / "cat").string()), HasSubstr("\"a\", \"b\"")));
}

TEST_F(ImageFolderTest, ClassesOptionRefusesExtraDirectory) {
  WriteUniformPng("a/1.png", 2, 1, 10);
  WriteUniformPng("dog/1.png", 2, 1, 20);
  ImageFolderOptions options = Gray(2);
  options.classes = {"a"};
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr((root_ / "dog").string()), HasSubstr("not a class")));
}

TEST_F(ImageFolderTest, RefusesEmptyClassDirectory) {
  WriteUniformPng("a/1.png", 2, 1, 10);
  WriteText("empty/readme.txt", "no images here");
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), Gray(2));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr((root_ / "empty").string()), HasSubstr("no images")));
}

TEST_F(ImageFolderTest, SkipsAndCountsNonImageEntries) {
  WriteUniformPng("a/1.png", 2, 1, 10);
  WriteText("a/labels.txt", "x");
  WriteText("a/.hidden.png", "not read: dotfiles are skipped");
  WriteText("a/._1.png", "macOS resource fork");
  WriteUniformPng("a/nested/2.png", 2, 1, 10);  // not entered: the nested directory counts once
  WriteText("LICENSE", "x");
  WriteText(".git/HEAD", "x");
  absl::StatusOr<ImageFolderLoad> load = LoadImageFolderWithReport(dir(), Gray(2));
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->dataset.count, 1u);
  EXPECT_THAT(load->dataset.class_names, ElementsAre("a"));
  EXPECT_EQ(load->skipped_files, 6u);
}

TEST_F(ImageFolderTest, RefusesMissingOrEmptyRoot) {
  absl::StatusOr<Dataset> data = LoadImageFolder(dir() + "/nope", Gray(2));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(dir() + "/nope"));

  data = LoadImageFolder(dir(), Gray(2));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("no class directories"));
}

TEST_F(ImageFolderTest, RefusesOversizedFilesAndTooManyImages) {
  const std::string path = WriteUniformPng("a/1.png", 8, 1, 10);
  WriteUniformPng("a/2.png", 8, 1, 10);
  ImageFolderOptions options = Gray(8);
  options.max_image_bytes = 10;
  absl::StatusOr<Dataset> data = LoadImageFolder(dir(), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(path), HasSubstr("over the limit of 10 bytes")));

  options = Gray(8);
  options.max_images = 1;
  data = LoadImageFolder(dir(), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("max_images"));
}

TEST_F(ImageFolderTest, RefusesBadOptionsNamingThem) {
  WriteUniformPng("a/1.png", 2, 1, 10);
  const auto refused = [&](const ImageFolderOptions& options, const std::string& option) {
    absl::StatusOr<Dataset> data = LoadImageFolder(dir(), options);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_THAT(data.status().message(),
                AllOf(HasSubstr(dir()), HasSubstr("ImageFolderOptions." + option)));
  };
  refused(Gray(0), "height");
  ImageFolderOptions options = Gray(2);
  options.width = 4097;
  refused(options, "width");
  options = Gray(2);
  options.channels = 2;
  refused(options, "channels");
  options = Rgb(2);
  options.mean = {0.5f};
  refused(options, "mean");
  options = Rgb(2);
  options.std = {1.0f, 0.0f, 1.0f};
  refused(options, "std[1]");
  options = Gray(2);
  options.classes = {"a", "a"};
  refused(options, "classes[1]");
  options = Gray(2);
  options.classes = {"../a"};
  refused(options, "classes[0]");
}

}  // namespace
}  // namespace shoal::data
