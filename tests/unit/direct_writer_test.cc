#include "libs/common/direct_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "libs/common/fd.h"

namespace shoal {
namespace {

class DirectWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal_direct_writer_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  // Whether the test directory's file system takes O_DIRECT (ext4 does; the writer must then
  // use it).
  bool DirectIoWorksHere() {
    const std::string path = (dir_ / "probe").string();
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644));
    return fd.valid();
  }

  std::filesystem::path dir_;
};

// Bytes that differ at every offset (a pattern that repeats would hide a misplaced block).
std::string Stream(size_t size) {
  std::string s(size, '\0');
  uint32_t x = 12345;
  for (char& c : s) {
    x = x * 1103515245 + 12345;
    c = static_cast<char>(x >> 16);
  }
  return s;
}

// Whatever the offset and however the stream is cut, the file holds the bytes that were there
// before the offset, then the stream, and nothing after it; several 4 MiB blocks, a last one
// that is not whole, and a tail that is not a whole alignment unit included.
TEST_F(DirectWriterTest, TheFileHoldsTheStreamAtItsOffsetWhateverThePieces) {
  const std::string stream = Stream(2 * DirectWriter::kBlock + 3 * DirectWriter::kAlignment + 77);
  for (uint64_t offset : {uint64_t{0}, uint64_t{100}, uint64_t{DirectWriter::kAlignment},
                          uint64_t{DirectWriter::kAlignment + 7}}) {
    for (size_t piece : {size_t{1000}, size_t{65536}, DirectWriter::kBlock + 1}) {
      SCOPED_TRACE(testing::Message() << "offset " << offset << ", pieces of " << piece);
      const std::string path = (dir_ / "f").string();
      const std::string before(offset, 'x');
      {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out << before;
      }
      Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
      ASSERT_TRUE(fd.valid());
      DirectWriter writer(fd.get(), offset);
      for (size_t at = 0; at < stream.size(); at += piece) {
        ASSERT_EQ(writer.Append(stream.data() + at, std::min(piece, stream.size() - at)), 0);
      }
      EXPECT_EQ(writer.direct(), DirectIoWorksHere());
      ASSERT_EQ(writer.Finish(), 0);
      EXPECT_FALSE(writer.direct());
      ASSERT_EQ(::fsync(fd.get()), 0);
      const std::string got = Read(path);
      ASSERT_EQ(got.size(), offset + stream.size());
      EXPECT_EQ(got.substr(0, offset), before);
      EXPECT_TRUE(got.substr(offset) == stream);
    }
  }
}

// After Finish the descriptor is buffered again: what is appended then, and what others write
// through it (a header at 0), lands as written.
TEST_F(DirectWriterTest, AfterFinishTheDescriptorIsBufferedAgain) {
  const std::string path = (dir_ / "f").string();
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid());
  const std::string stream = Stream(DirectWriter::kBlock + 10);
  DirectWriter writer(fd.get(), 16);
  ASSERT_EQ(writer.Append(stream.data(), stream.size()), 0);
  ASSERT_EQ(writer.Finish(), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_DIRECT, 0);
  ASSERT_EQ(writer.Append("end", 3), 0);
  ASSERT_EQ(WriteFull(fd.get(), "0123456789abcdef", 16, 0), 0);
  const std::string got = Read(path);
  EXPECT_EQ(got.substr(0, 16), "0123456789abcdef");
  EXPECT_TRUE(got.substr(16, stream.size()) == stream);
  EXPECT_EQ(got.substr(16 + stream.size()), "end");
}

// A write the descriptor cannot take (closed for writing) is reported, not lost.
TEST_F(DirectWriterTest, AFailedWriteIsReported) {
  const std::string path = (dir_ / "f").string();
  { std::ofstream(path) << ""; }
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  DirectWriter writer(fd.get(), 0);
  const std::string stream = Stream(DirectWriter::kBlock);
  EXPECT_EQ(writer.Append(stream.data(), stream.size()), EBADF);
}

}  // namespace
}  // namespace shoal
