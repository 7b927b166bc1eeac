// Inputs that once crashed, hung or leaked a fuzz target (tests/fuzz), replayed through the same
// decoders: each must now be answered quickly with OK or a clean error. Inputs live in
// tests/data/fuzz/<target>/, one file each, named after what went wrong.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "libs/common/clock.h"
#include "libs/data/csv_dataset.h"
#include "libs/data/idx_dataset.h"
#include "libs/data/image_folder.h"
#include "libs/gossip/dpwa_config.h"
#include "libs/task/task_file.h"
#include "services/aggregator/aggregator_core.h"
#include "tests/testing/fake_clock.h"

namespace shoal {
namespace {

using shoal::testing::FakeClock;

std::filesystem::path DataDir() {
  const char* root = std::getenv("SHOAL_SOURCE_DIR");
  return std::filesystem::path(root != nullptr ? root : ".") / "tests/data/fuzz";
}

std::vector<std::filesystem::path> Inputs(const std::string& target) {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path dir = DataDir() / target;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) out.push_back(entry.path());
  return out;
}

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Clean(absl::string_view message) {
  for (unsigned char c : message) {
    if (c < 0x20 || c == 0x7F) return false;
  }
  return true;
}

// A directory of its own for one test, removed at its end.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("shoal-fuzz-regression-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  // Writes `bytes` to `name` (parent directories created) and returns its path.
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << bytes;
    return file.string();
  }
  std::string Path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

bool AllFinite(const std::vector<float>& values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// The invariants the data fuzz targets check on a loaded data set.
void ExpectConsistent(const data::Dataset& set, const std::filesystem::path& input) {
  EXPECT_EQ(set.values.size(), set.count * set.SampleSize()) << input;
  EXPECT_EQ(set.labels.size(), set.count) << input;
  for (uint32_t label : set.labels) EXPECT_LT(label, set.class_names.size()) << input;
  EXPECT_TRUE(AllFinite(set.values)) << input;
}

TEST(FuzzRegressionTest, TaskFilesAreAnsweredQuickly) {
  std::vector<std::filesystem::path> inputs = Inputs("task_json");
  for (const auto& p : Inputs("task_yaml")) inputs.push_back(p);
  ASSERT_FALSE(inputs.empty()) << "no inputs under " << DataDir();
  for (const auto& path : inputs) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<common::v1::TaskSpec> spec = task::ParseTaskSpec(Read(path), "fuzz.yaml");
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, std::chrono::seconds(5)) << path;
    EXPECT_TRUE(Clean(spec.status().message())) << path;
    if (!spec.ok()) continue;
    EXPECT_TRUE(Clean(task::ValidateTaskSpec(*spec).message())) << path;
    // What parses renders as JSON that parses back to the same spec (an unset enum once
    // rendered as "unspecified", which no task file may hold).
    const std::string json = task::MessageToFriendlyJson(*spec);
    absl::StatusOr<common::v1::TaskSpec> back = task::ParseTaskSpec(json, "back.json");
    ASSERT_TRUE(back.ok()) << path << ": " << back.status() << "\n" << json;
    EXPECT_EQ(back->SerializeAsString(), spec->SerializeAsString()) << path;
  }
}

TEST(FuzzRegressionTest, DpwaConfigsAreAnsweredQuickly) {
  for (const auto& path : Inputs("dpwa_config")) {
    absl::StatusOr<gossip::DpwaConfig> config = gossip::ParseDpwaConfig(Read(path), "fuzz.yaml");
    EXPECT_TRUE(Clean(config.status().message())) << path;
  }
}

// fuzz_aggregator_push: names from the network were quoted raw in the aggregator's errors.
TEST(FuzzRegressionTest, AggregatorErrorsEscapeNamesFromTheNetwork) {
  prometheus::Registry registry;
  aggregator::AggregatorMetrics metrics(registry);
  FakeClock clock;
  auto core = aggregator::AggregatorCore::Create({}, clock, metrics);
  ASSERT_TRUE(core.ok());
  absl::Status s = (*core)->CheckCaller("t", "peer\x1b[2J", "", "cert\x07");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Clean(s.message())) << s.message();
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("'peer\\x1b[2J'"));
  absl::Status open = (*core)->OpenRound({"task\x1b", 1, 0, {}, 0});
  EXPECT_TRUE(Clean(open.message())) << open.message();
}

// The data loaders, fed each input as fuzz_csv_data, fuzz_idx_data and fuzz_image_folder feed
// them (the first bytes choose the options; see those files).
TEST(FuzzRegressionTest, DataFilesAreAnsweredCleanly) {
  TempDir dir;
  for (const auto& path : Inputs("csv_data")) {
    const std::string input = Read(path);
    if (input.empty()) continue;
    data::CsvOptions options;
    options.label_column = "label";
    if (input[0] & 1) options.classes = {"a", "b", "c"};
    absl::StatusOr<data::Dataset> set = data::LoadCsv(dir.Write("f.csv", input.substr(1)), options);
    EXPECT_TRUE(Clean(set.status().message())) << path;
    if (!set.ok()) continue;
    ExpectConsistent(*set, path);
    // fuzz_csv_data: standardising a table with values near float's limits computed
    // (3e38 - -1e38) in float and wrote infinities into the data set.
    absl::StatusOr<data::Standardization> stats = data::ComputeStandardization(*set);
    ASSERT_TRUE(stats.ok()) << path << ": " << stats.status();
    ASSERT_TRUE(data::ApplyStandardization(*stats, *set).ok()) << path;
    EXPECT_TRUE(AllFinite(set->values)) << path;
  }
  for (const auto& path : Inputs("idx_data")) {
    const std::string input = Read(path);
    if (input.size() < 2) continue;
    const size_t split = std::min<size_t>(
        (size_t{static_cast<unsigned char>(input[0])} << 8) | static_cast<unsigned char>(input[1]),
        input.size() - 2);
    data::IdxOptions options;
    options.max_bytes = uint64_t{64} << 20;
    absl::StatusOr<data::Dataset> set =
        data::LoadIdx(dir.Write("images.idx", input.substr(2, split)),
                      dir.Write("labels.idx", input.substr(2 + split)), options);
    EXPECT_TRUE(Clean(set.status().message())) << path;
    if (set.ok()) ExpectConsistent(*set, path);
  }
  for (const auto& path : Inputs("image_folder")) {
    const std::string input = Read(path);
    if (input.empty()) continue;
    std::filesystem::remove_all(dir.Path("root"));
    dir.Write((input[0] & 1) ? "root/c0/x.jpg" : "root/c0/x.png", input.substr(1));
    data::ImageFolderOptions options;
    options.height = 8;
    options.width = 8;
    options.channels = (input[0] & 2) ? 3 : 1;
    options.classes = {"c0"};
    absl::StatusOr<data::Dataset> set = data::LoadImageFolder(dir.Path("root"), options);
    // fuzz_image_folder: stb_image's reason for an unknown PNG chunk held the chunk's type
    // bytes, which the loader once quoted raw.
    EXPECT_TRUE(Clean(set.status().message())) << path;
    if (set.ok()) ExpectConsistent(*set, path);
  }
}

// Loads the kept fuzz input tests/data/fuzz/image_folder/`name` (its first byte, the options
// byte, dropped) as an image folder's one image `file` (x.png or x.jpg), 8 x 8 x `channels`.
absl::Status LoadKeptImage(const std::string& name, const std::string& file, int channels) {
  const std::string input = Read(DataDir() / "image_folder" / name);
  EXPECT_FALSE(input.empty()) << name;
  TempDir dir;
  dir.Write("root/c0/" + file, input.substr(1));
  data::ImageFolderOptions options;
  options.height = 8;
  options.width = 8;
  options.channels = channels;
  return data::LoadImageFolder(dir.Path("root"), options).status();
}

// Inputs that fuzz_image_folder found when the loader decoded with stb_image 2.27 (Debian
// bookworm's libstb, replaced by libpng and libjpeg-turbo since): each made stb read or write out
// of bounds, or allocate gigabytes, and each is refused now, with the decoder's reason.
// A JPEG Huffman table whose 16 code counts add up to 620, more than the 256 a table holds.
TEST(FuzzRegressionTest, JpegHuffmanTableOverflowIsRefused) {
  const absl::Status loaded = LoadKeptImage("jpeg-huffman-table-over-256-codes", "x.jpg", 3);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.message()),
              ::testing::HasSubstr("corrupt or truncated JPEG image: Bogus Huffman table"));
}

// A progressive JPEG whose AC scan names a Huffman table that no DHT segment defined.
TEST(FuzzRegressionTest, JpegScanWithUndefinedHuffmanTableIsRefused) {
  const absl::Status loaded = LoadKeptImage("jpeg-scan-with-undefined-huffman-table", "x.jpg", 3);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.message()),
              ::testing::HasSubstr("corrupt or truncated JPEG image: Corrupt JPEG data"));
}

// A 176-byte PNG whose second IDAT chunk declares about a gigabyte (and whose header's checksum
// is wrong, which stb did not check).
TEST(FuzzRegressionTest, PngChunkLongerThanTheFileIsRefused) {
  const absl::Status loaded = LoadKeptImage("png-chunk-longer-than-the-file", "x.png", 1);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.message()),
              ::testing::HasSubstr("corrupt or truncated PNG image: IHDR: CRC error"));
}

// Statistics of one split applied to another can map a value past float's range: refused,
// and the data left as it was.
TEST(FuzzRegressionTest, StandardizationPastFloatRangeIsRefused) {
  data::Dataset set;
  set.sample_shape = {1};
  set.count = 2;
  set.values = {3e38f, 1.0f};
  set.labels = {0, 0};
  set.class_names = {"0"};
  const absl::Status s = data::ApplyStandardization({{0.0f}, {1e-30f}}, set);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("outside float's range"));
  EXPECT_EQ(set.values, (std::vector<float>{3e38f, 1.0f}));
}

}  // namespace
}  // namespace shoal
