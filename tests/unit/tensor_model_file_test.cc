#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/tensor/model_file.h"
#include "libs/tensor/spill_file.h"

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

TEST_F(ModelFileTest, OnlyFloat32TensorsAreWritten) {
  // A masked update's ring values are not a model: a model file's layout has no element type.
  FlatModel ring = model_;
  ring.layout = *ModelLayout::Create({{"a", {3, 4}}, TensorSpec{"b", {5}, Element::kUint32}});
  absl::Status s = WriteModelFile(Path("ring.bin"), ring);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor 'b' is not float32"));
  auto writer = ModelFileWriter::Create(dir_.string(), 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(0, ring.values).ok());
  EXPECT_THAT((*writer)->Commit(ring.layout, Path("ring.model")).message(),
              HasSubstr("not float32"));
  writer->reset();
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
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

// A layout section of 4 bytes that claims a million tensors (checksums right, so that the count
// is read) is refused by the count, not after making room for a million entries.
TEST_F(ModelFileTest, ATensorCountTheLayoutCannotHoldIsRefused) {
  ASSERT_TRUE(WriteModelFile(Path("m.bin"), model_).ok());
  std::string file;
  {
    std::ifstream in(Path("m.bin"), std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GE(file.size(), 12u);
  file.resize(12);  // magic and format version
  auto put = [&file](auto v) { file.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  const uint32_t count = 1u << 20;
  put(uint32_t{sizeof(count)});
  put(count);
  put(DigestBytes(&count, sizeof(count)));
  put(uint64_t{0});
  put(DigestBytes(nullptr, 0));
  std::ofstream(Path("m.bin"), std::ios::binary | std::ios::trunc) << file;

  for (const auto& got :
       {ReadModelFile(Path("m.bin")).status(), MappedModelFile::Open(Path("m.bin")).status()}) {
    EXPECT_EQ(got.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(got.message(),
                HasSubstr("1048576 tensors cannot fit in a layout section of 4 bytes"));
  }
}

TEST_F(ModelFileTest, AMappedFileHasTheValuesAndTheSameChecks) {
  ASSERT_TRUE(WriteModelFile(Path("m.bin"), model_).ok());
  auto mapped = MappedModelFile::Open(Path("m.bin"));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->layout(), model_.layout);
  for (size_t t = 0; t < model_.layout.num_tensors(); ++t) {
    const absl::string_view bytes = (*mapped)->TensorBytes(t);
    const size_t n = static_cast<size_t>(model_.layout.tensors()[t].NumElements());
    ASSERT_EQ(bytes.size(), n * sizeof(float));
    std::vector<float> values(n);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    EXPECT_EQ(values, std::vector<float>(model_.values.begin() + model_.layout.offset(t),
                                         model_.values.begin() + model_.layout.offset(t) + n));
  }
  // The mapping outlives a replacement of the file (a newer checkpoint renamed over it).
  FlatModel other = model_;
  other.values.assign(other.values.size(), 7.0f);
  ASSERT_TRUE(WriteModelFile(Path("m.bin"), other).ok());
  EXPECT_EQ((*mapped)->TensorBytes(1).substr(0, sizeof(float)),
            absl::string_view(reinterpret_cast<const char*>(&model_.values[12]), sizeof(float)));

  EXPECT_EQ(MappedModelFile::Open(Path("nope.bin")).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(Path("x.txt")) << "hello, this is not a model file at all";
  EXPECT_EQ(MappedModelFile::Open(Path("x.txt")).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto size = std::filesystem::file_size(Path("m.bin"));
  {
    std::fstream f(Path("m.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 3));
    f.put('\x7f');
  }
  auto corrupt = MappedModelFile::Open(Path("m.bin"));
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("digest"));
  std::filesystem::resize_file(Path("m.bin"), size - 4);
  EXPECT_EQ(MappedModelFile::Open(Path("m.bin")).status().code(), absl::StatusCode::kDataLoss);
}

// A streamed write, in pieces: at the right values offset the values stay where they were
// written; at another (0: unknown) they are copied behind the header. Either way the file is
// the one WriteModelFile writes, with its mode, and no temporary file is left.
TEST_F(ModelFileTest, AStreamedWriteMakesTheSameFileAtAnyValuesOffset) {
  ASSERT_TRUE(WriteModelFile(Path("whole.model"), model_).ok());
  std::ifstream whole_in(Path("whole.model"), std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(whole_in)), {});
  const uint64_t right = ModelFileValuesOffset(model_.layout);
  EXPECT_EQ(right, whole.size() - model_.layout.total_bytes());
  for (uint64_t offset : {right, uint64_t{0}, right + 100}) {
    auto writer = ModelFileWriter::Create(dir_.string(), offset);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const absl::Span<const float> values(model_.values);
    ASSERT_TRUE((*writer)->Write(0, values.subspan(0, 5)).ok());
    ASSERT_TRUE((*writer)->Write(5, values.subspan(5, 9)).ok());
    ASSERT_TRUE((*writer)->Write(14, values.subspan(14)).ok());
    EXPECT_EQ((*writer)->digest(), model_.Digest());
    const std::string path = Path("streamed.model");
    ASSERT_TRUE((*writer)->Commit(model_.layout, path).ok()) << offset;
    writer->reset();
    std::ifstream in(path, std::ios::binary);
    EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), {}), whole) << offset;
    auto got = ReadModelFile(path);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->values, model_.values);
    // The mode WriteModelFile's file has (0644 less the umask), not the temporary's 0600.
    EXPECT_EQ(std::filesystem::status(path).permissions(),
              std::filesystem::status(Path("whole.model")).permissions())
        << offset;
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                            std::filesystem::directory_iterator()),
              2)
        << offset;
  }
}

// The same with a model of several of DirectWriter's blocks (its values go around the page
// cache where the file system allows), streamed in pieces that do not fall on its blocks.
TEST_F(ModelFileTest, AStreamedWriteOfALargeModelMakesTheSameFile) {
  FlatModel large;
  large.layout = *ModelLayout::Create({{"w", {1000, 2600}}, {"b", {7}}});
  large.values.resize(large.layout.total_elements());
  for (size_t i = 0; i < large.values.size(); ++i) large.values[i] = 0.001f * (i % 9973) - 3;
  ASSERT_TRUE(WriteModelFile(Path("whole.model"), large).ok());
  std::ifstream whole_in(Path("whole.model"), std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(whole_in)), {});
  const uint64_t right = ModelFileValuesOffset(large.layout);
  for (uint64_t offset : {right, uint64_t{0}}) {
    auto writer = ModelFileWriter::Create(dir_.string(), offset);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const absl::Span<const float> values(large.values);
    constexpr size_t kPiece = 65536 + 3;  // floats
    for (size_t at = 0; at < values.size(); at += kPiece) {
      ASSERT_TRUE((*writer)->Write(at, values.subspan(at, kPiece)).ok()) << at;
    }
    const std::string path = Path("streamed.model");
    ASSERT_TRUE((*writer)->Commit(large.layout, path).ok()) << offset;
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(std::string((std::istreambuf_iterator<char>(in)), {}) == whole) << offset;
  }
}

TEST_F(ModelFileTest, AStreamedWriteRefusesGapsAndShortModelsAndLeavesNothing) {
  {
    auto writer = ModelFileWriter::Create(dir_.string(), 0);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const absl::Span<const float> values(model_.values);
    ASSERT_TRUE((*writer)->Write(0, values.subspan(0, 5)).ok());
    absl::Status s = (*writer)->Write(6, values.subspan(6, 2));
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    s = (*writer)->Commit(model_.layout, Path("short.model"));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("got 5 values but its layout needs 17"));
  }
  EXPECT_FALSE(std::filesystem::exists(Path("short.model")));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  auto missing = ModelFileWriter::Create(Path("no/such/dir"), 0);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("no/such/dir"));
}

// The temporaries a crash leaves are known by their names: a ModelFileWriter's while it is
// open, and WriteModelFile's (PATH.tmp.PID, written by hand here as a crash would leave it).
TEST_F(ModelFileTest, WhatAWriteCutShortLeavesIsKnownByItsName) {
  auto writer = ModelFileWriter::Create(dir_.string(), 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(WriteModelFile(Path("kept.model"), model_).ok());
  std::ofstream(Path("kept.model.tmp.4242")) << "half a model";
  std::vector<std::string> unfinished;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (IsUnfinishedModelWrite(name)) unfinished.push_back(name);
  }
  std::sort(unfinished.begin(), unfinished.end());
  ASSERT_EQ(unfinished.size(), 2u);
  EXPECT_THAT(unfinished[0], ::testing::StartsWith(".model-"));
  EXPECT_EQ(unfinished[1], "kept.model.tmp.4242");
  for (const char* name : {"kept.model", "a.tmp.", "a.tmp.12x", ".tmp.12", ".model-abc"}) {
    EXPECT_FALSE(IsUnfinishedModelWrite(name)) << name;
  }
}

TEST_F(ModelFileTest, WriteIntoMissingDirectoryFails) {
  absl::Status s = WriteModelFile(Path("no/such/dir/m.bin"), model_);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no/such/dir"));
}

TEST_F(ModelFileTest, SpillFileKeepsValuesAndSubtractsThemInChunks) {
  auto spill = SpillFile::Create(dir_.string());
  ASSERT_TRUE(spill.ok()) << spill.status();
  // Unnamed: nothing appears in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  std::vector<float> stored(600'000);  // more than two 1 MiB chunks
  for (size_t i = 0; i < stored.size(); ++i) stored[i] = 0.5f * static_cast<float>(i % 1000);
  ASSERT_TRUE(spill->Write(stored).ok());
  EXPECT_EQ(spill->size(), stored.size());
  std::vector<float> back(stored.size());
  ASSERT_TRUE(spill->Read(absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, stored);

  std::vector<float> values(stored.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = stored[i] + 0.25f;
  ASSERT_TRUE(spill->SubtractFrom(absl::MakeSpan(values)).ok());
  EXPECT_EQ(values, std::vector<float>(stored.size(), 0.25f));

  // A write replaces what was there, a shorter one too; sizes must match.
  ASSERT_TRUE(spill->Write(std::vector<float>{1, 2, 3}).ok());
  EXPECT_EQ(spill->size(), 3u);
  absl::Status wrong = spill->SubtractFrom(absl::MakeSpan(values));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("holds 3 values"));
  std::vector<float> three(3);
  ASSERT_TRUE(spill->Read(absl::MakeSpan(three)).ok());
  EXPECT_EQ(three, (std::vector<float>{1, 2, 3}));
}

TEST_F(ModelFileTest, SpillFileIsFilledPieceByPieceWithinItsSize) {
  auto spill = SpillFile::Create(dir_.string());
  ASSERT_TRUE(spill.ok()) << spill.status();
  ASSERT_TRUE(spill->Write(std::vector<float>{9, 9}).ok());
  ASSERT_TRUE(spill->Reset(5).ok());  // five zeros, the old values gone
  EXPECT_EQ(spill->size(), 5u);
  ASSERT_TRUE(spill->WriteAt(3, std::vector<float>{4, 5}).ok());
  ASSERT_TRUE(spill->WriteAt(0, std::vector<float>{1}).ok());
  std::vector<float> all(5);
  ASSERT_TRUE(spill->Read(absl::MakeSpan(all)).ok());
  EXPECT_EQ(all, (std::vector<float>{1, 0, 0, 4, 5}));
  std::vector<float> two(2);
  ASSERT_TRUE(spill->ReadAt(3, absl::MakeSpan(two)).ok());
  EXPECT_EQ(two, (std::vector<float>{4, 5}));

  // Nothing goes or comes from past the end.
  absl::Status past = spill->WriteAt(4, std::vector<float>{1, 2});
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past.message(), HasSubstr("holds 5 values"));
  EXPECT_EQ(spill->ReadAt(6, absl::MakeSpan(two)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(spill->size(), 5u);
}

TEST_F(ModelFileTest, SpillFileInAMissingDirectoryNamesIt) {
  auto spill = SpillFile::Create(Path("missing"));
  EXPECT_EQ(spill.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spill.status().message(), HasSubstr(Path("missing")));
}

}  // namespace
}  // namespace shoal::tensor
