#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/tensor/model_file.h"

namespace shoal::tensor {
namespace {

using ::testing::HasSubstr;

class ModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal_model_file_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    model_.layout = *ModelLayout::Create({{"a", {3, 4}}, {"b", {5}}});
    model_.values.resize(model_.layout.total_elements());
    for (size_t i = 0; i < model_.values.size(); ++i) model_.values[i] = 0.1f * i - 0.3f;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }

  std::filesystem::path dir_;
  FlatModel model_;
};

TEST_F(ModelFileTest, RoundTrip) {
  ASSERT_TRUE(WriteModelFile(Path("m.bin"), model_).ok());
  auto got = ReadModelFile(Path("m.bin"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layout, model_.layout);
  EXPECT_EQ(got->values, model_.values);
  // No temporary files are left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(ModelFileTest, MissingFileIsNotFound) {
  auto got = ReadModelFile(Path("nope.bin"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("nope.bin"));
}

TEST_F(ModelFileTest, NotAModelFile) {
  std::ofstream(Path("x.txt")) << "hello, this is not a model file at all";
  EXPECT_EQ(ReadModelFile(Path("x.txt")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelFileTest, CorruptValuesAndTruncationAreDataLoss) {
  ASSERT_TRUE(WriteModelFile(Path("m.bin"), model_).ok());
  auto size = std::filesystem::file_size(Path("m.bin"));
  {
    std::fstream f(Path("m.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 3));
    f.put('\x7f');
  }
  auto got = ReadModelFile(Path("m.bin"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("digest"));

  ASSERT_TRUE(WriteModelFile(Path("m.bin"), model_).ok());
  std::filesystem::resize_file(Path("m.bin"), size - 4);
  EXPECT_EQ(ReadModelFile(Path("m.bin")).status().code(), absl::StatusCode::kDataLoss);

  ASSERT_TRUE(WriteModelFile(Path("m.bin"), model_).ok());
  {
    std::fstream f(Path("m.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(22);  // inside the layout section
    f.put('Z');
  }
  EXPECT_EQ(ReadModelFile(Path("m.bin")).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(ModelFileTest, WriteIntoMissingDirectoryFails) {
  absl::Status s = WriteModelFile(Path("no/such/dir/m.bin"), model_);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no/such/dir"));
}

}  // namespace
}  // namespace shoal::tensor
