// Untrusted input in configuration files and model streams: size and nesting caps, values named
// as written, and bytes escaped in every error that quotes input (issue 10).

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/small_file.h"
#include "libs/common/yaml_depth.h"
#include "libs/gossip/dpwa_config.h"
#include "libs/task/task_file.h"
#include "libs/tensor/frame_codec.h"

namespace shoal {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string M(const absl::Status& status) { return std::string(status.message()); }

// True when `text` holds a byte a terminal could act on (C0 controls but none, DEL, C1 lead).
bool HasRawControlBytes(absl::string_view text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7F) return true;
  }
  return false;
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("shoal-untrusted-" + std::to_string(::getpid()) + "-" +
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

TEST(EscapeBytesTest, KeepsPrintableTextAndEscapesTheRest) {
  EXPECT_EQ(EscapeBytes("plain text-1.0"), "plain text-1.0");
  EXPECT_EQ(EscapeBytes("a\nb\tc\\d"), "a\\nb\\tc\\\\d");
  EXPECT_EQ(EscapeBytes("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(EscapeBytes(std::string("\0\x7f", 2)), "\\x00\\x7f");
  EXPECT_EQ(EscapeBytes("caf\xc3\xa9"), "caf\xc3\xa9");  // é: printable UTF-8 is kept
  EXPECT_EQ(EscapeBytes("\xc2\x9b"
                        "2J"),
            "\\xc2\\x9b2J");                         // C1 CSI is escaped
  EXPECT_EQ(EscapeBytes("\xff\xfe"), "\\xff\\xfe");  // not UTF-8
  EXPECT_EQ(EscapeBytes("\xe2\x82"), "\\xe2\\x82");  // truncated sequence
  EXPECT_EQ(EscapeBytes(std::string(300, 'x')), std::string(200, 'x') + "...");
  EXPECT_EQ(QuoteBytes("say \"hi\"\x01"), "\"say \\\"hi\\\"\\x01\"");
}

TEST(ReadSmallFileTest, RefusesALargeFileFromItsSizeBeforeReadingIt) {
  TempDir dir;
  const std::string path = dir.Path("big.yaml");
  {
    // 50 MB, sparse: reading it would take time and memory; the size check must not.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 50'000'000), 0);
    ::close(fd);
  }
  absl::StatusOr<std::string> text = ReadSmallFile(path, 1 << 20, "task file");
  ASSERT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(),
            path + ": the task file is 50000000 bytes, over the limit of 1048576 bytes (1 MiB)");

  EXPECT_EQ(ReadSmallFile(dir.Path("missing"), 10, "task file").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*ReadSmallFile(dir.Write("small", "0123456789"), 10, "task file"), "0123456789");
  EXPECT_EQ(ReadSmallFile(dir.Write("eleven", "0123456789A"), 10, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TaskFileLimitsTest, LoadTaskFileNamesFileSizeAndLimit) {
  TempDir dir;
  const std::string path = dir.Write("huge.yaml", "name: x\n" + std::string(2 << 20, '#'));
  absl::StatusOr<common::v1::TaskSpec> spec = task::LoadTaskFile(path);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(M(spec.status()), AllOf(StartsWith(path + ":"), HasSubstr("2097160 bytes"),
                                      HasSubstr("over the limit of 1048576 bytes (1 MiB)")));
  // Text handed over directly (not from a file) has the same cap.
  EXPECT_THAT(M(task::ParseTaskSpec(std::string((1 << 20) + 1, ' '), "rpc").status()),
              HasSubstr("over the limit of 1048576 bytes"));
}

std::string Nested(int depth, const std::string& open, const std::string& close,
                   const std::string& leaf) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += open;
  text += leaf;
  for (int i = 0; i < depth; ++i) text += close;
  return text;
}

TEST(TaskFileLimitsTest, DeepNestingIsRefusedWithAClearError) {
  // Far deeper than any stack would take if it were parsed recursively.
  for (const std::string& text :
       {Nested(100000, "[", "]", "1"), Nested(100000, "{\"a\":", "}", "1"),
        Nested(5000, "- ", "", "x"), Nested(33, "{a: ", "}", "1")}) {
    absl::StatusOr<common::v1::TaskSpec> spec = task::ParseTaskSpec(text, "deep.yaml");
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(M(spec.status()),
                AllOf(StartsWith("deep.yaml:"), HasSubstr("nested more than 32 levels deep")))
        << text.substr(0, 40);
  }
  // 32 levels are within the limit (the schema rejects them for other reasons).
  EXPECT_THAT(M(task::ParseTaskSpec(Nested(32, "{a: ", "}", "1"), "ok.yaml").status()),
              Not(HasSubstr("nested")));
  EXPECT_TRUE(CheckYamlDepth(Nested(32, "[", "]", ""), "x").ok());
}

TEST(TaskFileLimitsTest, NonFiniteNumbersAreNamedAsWritten) {
  const std::pair<const char*, const char*> cases[] = {
      {"name: t\noptimizer: {learning_rate: .nan}\n", "got .nan"},
      {"name: t\noptimizer: {learning_rate: .NaN}\n", "got .NaN"},
      {"name: t\nmax_update_norm: -.inf\n", "got -.inf"},
      {"{\"name\": \"t\", \"optimizer\": {\"momentum\": NaN}}", "got NaN"},
      {"{\"name\": \"t\", \"max_update_norm\": Infinity}", "got Infinity"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<common::v1::TaskSpec> spec = task::ParseTaskSpec(text, "t.yaml");
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_THAT(M(spec.status()), AllOf(HasSubstr("must be finite"), HasSubstr(want))) << text;
    EXPECT_THAT(M(spec.status()), Not(HasSubstr("null")));
  }
  // A spec that arrives without a file (gRPC) names the value too, never as null.
  common::v1::TaskSpec spec = task::DefaultTaskSpec();
  spec.set_name("t");
  spec.mutable_optimizer()->set_learning_rate(std::nan(""));
  EXPECT_EQ(task::ValidateTaskSpec(spec).message(),
            "optimizer.learning_rate: must be > 0, got nan");
}

TEST(TaskFileLimitsTest, BinaryInputIsEscapedInErrors) {
  const std::string inputs[] = {
      "name: \"\\e[2J\\x07bell\"\n",             // YAML escapes -> control bytes in the value
      "name: t\nmodel: \"\x1b]0;title\x07\"\n",  // raw control bytes in a quoted value
      "\x1b[31m: 1\n",                           // in an unknown key
      "batch_size: \x1b[31m\n",                  // in a bad number
      std::string("\x7f\x45LF\x02\x01\x01\0\0\0", 10),  // a binary file
      "name: t\nmode: \"\xc2\x9b"
      "31m\"\n",  // C1 control in an enum value
  };
  for (const std::string& text : inputs) {
    absl::StatusOr<common::v1::TaskSpec> spec = task::ParseTaskSpec(text, "bin\x1b.yaml");
    if (spec.ok()) {
      spec = absl::InvalidArgumentError(
          absl::StrCat("bin\\x1b.yaml: ", task::ValidateTaskSpec(*spec).message()));
    }
    ASSERT_FALSE(spec.ok()) << EscapeBytes(text);
    EXPECT_FALSE(HasRawControlBytes(spec.status().message())) << EscapeBytes(text);
    EXPECT_THAT(M(spec.status()), Not(HasSubstr("\xc2\x9b")));
    EXPECT_THAT(M(spec.status()), StartsWith("bin\\x1b.yaml"));
  }
  TempDir dir;
  const std::string path = dir.Write("bin.yaml", "name: t\nmodel: \"\x1b[5m\"\n");
  absl::StatusOr<common::v1::TaskSpec> loaded = task::LoadTaskFile(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(M(loaded.status()),
              HasSubstr("model: control characters are not allowed: \"\\x1b[5m\""));
  // Strings must be UTF-8 (proto3): found by fuzz_task_yaml, whose JSON rendering did not parse.
  EXPECT_THAT(M(task::ParseTaskSpec("name: \"a\xff\"\n", "t.yaml").status()),
              HasSubstr("t.yaml: name: not valid UTF-8: \"a\\xff\""));
  EXPECT_THAT(M(task::ParseTaskSpec("join_token: \"caf\xc3\xa9\"\n", "t.yaml").status()),
              Not(HasSubstr("UTF-8")));
}

TEST(DpwaConfigLimitsTest, CapsSizeAndDepthAndEscapes) {
  EXPECT_THAT(M(gossip::ParseDpwaConfig(std::string((1 << 20) + 1, ' '), "d.yaml").status()),
              HasSubstr("over the limit of 1048576 bytes"));
  EXPECT_THAT(M(gossip::ParseDpwaConfig(Nested(100000, "[", "]", ""), "d.yaml").status()),
              HasSubstr("d.yaml:1:33: nested more than 32 levels deep"));
  absl::StatusOr<gossip::DpwaConfig> config =
      gossip::ParseDpwaConfig("- \"\x1b[2J\": 1\n", "d.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(M(config.status()), HasSubstr("\\x1b[2J: unknown key"));
  config = gossip::ParseDpwaConfig(
      "- nodes: [{name: a, host: h, port: 1}]\n- fetch_probability: .nan\n", "d.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(M(config.status()), HasSubstr("got \".nan\""));
  TempDir dir;
  const std::string big = dir.Write("big.yaml", std::string(2 << 20, '#'));
  EXPECT_THAT(M(gossip::LoadDpwaConfig(big).status()),
              HasSubstr("the dpwa config is 2097152 bytes (2 MiB), over the limit"));
}

TEST(FrameDecoderEscapingTest, TensorNamesFromTheStreamAreEscaped) {
  common::v1::ModelMeta meta;
  meta.set_num_tensors(1);
  meta.set_total_bytes(4);
  auto decoder = tensor::FrameDecoder::ForMeta(meta, {}, /*require_finite=*/true);
  ASSERT_TRUE(decoder.ok());
  common::v1::TensorFrame frame;
  frame.mutable_header()->set_name("w\x1b[2J");
  frame.mutable_header()->set_dtype(common::v1::DTYPE_FLOAT32);
  frame.mutable_header()->set_encoding(common::v1::ENCODING_RAW);
  frame.mutable_header()->add_shape(2);
  frame.mutable_header()->set_size_bytes(8);
  absl::Status s = decoder->Add(frame);
  EXPECT_THAT(M(s), HasSubstr("tensor 'w\\x1b[2J' (8 bytes) exceeds"));
  EXPECT_FALSE(HasRawControlBytes(s.message()));
}

}  // namespace
}  // namespace shoal
