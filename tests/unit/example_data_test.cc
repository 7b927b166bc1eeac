// shoal-example-data as a user runs it: the files it writes load with libs/data's CSV and
// image-folder loaders, the same flags give the same bytes, and existing data is not replaced
// without --force.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "libs/data/csv_dataset.h"
#include "libs/data/image_folder.h"

namespace shoal::data {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kConditions = {"normal", "worn", "overheating", "misaligned"};
const std::vector<std::string> kFeatures = {"temperature", "pressure", "vibration", "rpm",
                                            "current",     "humidity", "noise_db",  "oil_hours"};
const std::vector<std::string> kFashion = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                           "sandal",  "shirt",   "sneaker",  "bag",   "ankle-boot"};
constexpr char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every regular file under `root` by relative path, with its bytes.
std::map<std::string, std::string> Tree(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = ReadAll(e.path());
  }
  return out;
}

std::vector<size_t> PerClass(const Dataset& d) {
  std::vector<size_t> out(d.class_names.size());
  for (uint32_t l : d.labels) ++out[l];
  return out;
}

class ExampleDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("SHOAL_BIN_DIR");
    ASSERT_NE(bin, nullptr) << "SHOAL_BIN_DIR is unset (ctest sets it)";
    tool_ = fs::path(bin) / "shoal-example-data";
    ASSERT_TRUE(fs::exists(tool_)) << tool_;
    if (!fs::exists(fs::path(kFashionDir) / "t10k-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "no Fashion-MNIST in " << kFashionDir;
    }
    std::string tmpl = ::testing::TempDir() + "/example_data_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  // Runs the tool with `args`; returns its exit code and keeps its output in output_.
  int Run(const std::string& args) {
    const fs::path log = root_ / "tool.log";
    const std::string command = tool_.string() + " " + args + " > " + log.string() + " 2>&1";
    const int status = std::system(command.c_str());
    output_ = ReadAll(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string Small(const fs::path& out) {
    return "--out " + out.string() + " --peers 2 --images-per-peer 50";
  }

  fs::path tool_;
  fs::path root_;
  std::string output_;
};

TEST_F(ExampleDataTest, WritesLoadableTablesAndImageFolders) {
  const fs::path out = root_ / "a";
  ASSERT_EQ(Run(Small(out)), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("tabular peer-1:"));
  EXPECT_THAT(output_, HasSubstr("images peer-1:"));
  EXPECT_TRUE(fs::exists(out / "tabular" / "README.txt"));
  EXPECT_TRUE(fs::exists(out / "images" / "README.txt"));
  EXPECT_FALSE(fs::exists(out / "tabular" / "peer-2"));

  CsvOptions csv;
  csv.label_column = "condition";
  csv.feature_columns = kFeatures;
  csv.classes = kConditions;
  ImageFolderOptions images;
  images.height = images.width = 28;
  images.channels = 1;
  images.classes = kFashion;
  std::set<std::string> image_files;
  for (int peer = 0; peer < 2; ++peer) {
    const fs::path dir = out / "tabular" / ("peer-" + std::to_string(peer));
    absl::StatusOr<Dataset> train = LoadCsv((dir / "train.csv").string(), csv);
    ASSERT_TRUE(train.ok()) << train.status();
    EXPECT_EQ(train->count, 1500u);
    EXPECT_EQ(train->feature_names, kFeatures);
    EXPECT_EQ(train->class_names, kConditions);
    // Label-skewed: this peer's two classes dominate, the others are present but rare.
    std::vector<size_t> counts = PerClass(*train);
    EXPECT_EQ(counts[peer], 600u);
    EXPECT_EQ(counts[peer + 1], 600u);
    EXPECT_EQ(counts[0] + counts[1] + counts[2] + counts[3], 1500u);
    for (size_t c : counts) EXPECT_GE(c, 100u);
    absl::StatusOr<Dataset> test = LoadCsv((dir / "test.csv").string(), csv);
    ASSERT_TRUE(test.ok()) << test.status();
    EXPECT_EQ(test->count, 400u);
    EXPECT_THAT(PerClass(*test), ElementsAre(100, 100, 100, 100));
    // The id column is there and is not a feature: leaving the features unset makes it one.
    CsvOptions all = csv;
    all.feature_columns.clear();
    absl::StatusOr<Dataset> with_id = LoadCsv((dir / "test.csv").string(), all);
    ASSERT_TRUE(with_id.ok()) << with_id.status();
    EXPECT_EQ(with_id->feature_names.front(), "id");

    for (const char* split : {"train", "test"}) {
      const fs::path folder = out / "images" / ("peer-" + std::to_string(peer)) / split;
      absl::StatusOr<Dataset> d = LoadImageFolder(folder.string(), images);
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_THAT(d->sample_shape, ElementsAre(1, 28, 28));
      const bool train_split = std::string(split) == "train";
      EXPECT_EQ(d->count, train_split ? 50u : 200u);
      for (size_t c : PerClass(*d)) EXPECT_EQ(c, train_split ? 5u : 20u);
      // Slices are disjoint between peers: a file name is its source index.
      for (const auto& e : fs::recursive_directory_iterator(folder)) {
        if (e.is_regular_file()) {
          EXPECT_TRUE(image_files.insert(std::string(split) + e.path().filename().string()).second)
              << e.path();
        }
      }
    }
  }
}

TEST_F(ExampleDataTest, SameFlagsGiveTheSameBytes) {
  ASSERT_EQ(Run(Small(root_ / "a")), 0) << output_;
  ASSERT_EQ(Run(Small(root_ / "b")), 0) << output_;
  const std::map<std::string, std::string> a = Tree(root_ / "a");
  EXPECT_EQ(a.size(), 2u + 4u + 2u * 250u);  // READMEs, CSVs, PNGs
  EXPECT_TRUE(a == Tree(root_ / "b"));
  ASSERT_EQ(Run(Small(root_ / "c") + " --seed 8 --kind tabular"), 0) << output_;
  EXPECT_FALSE(fs::exists(root_ / "c" / "images"));
  EXPECT_NE(ReadAll(root_ / "c/tabular/peer-0/train.csv"), a.at("tabular/peer-0/train.csv"));
}

TEST_F(ExampleDataTest, RefusesToReplaceDataWithoutForce) {
  const fs::path out = root_ / "a";
  ASSERT_EQ(Run(Small(out) + " --kind tabular"), 0) << output_;
  const fs::path marker = out / "tabular" / "mine.txt";
  std::ofstream(marker) << "keep";
  EXPECT_EQ(Run(Small(out) + " --kind tabular"), 1);
  EXPECT_THAT(output_, HasSubstr("--force"));
  EXPECT_TRUE(fs::exists(marker));
  // --kind all refuses before it writes images/ either.
  EXPECT_EQ(Run(Small(out)), 1);
  EXPECT_FALSE(fs::exists(out / "images"));
  ASSERT_EQ(Run(Small(out) + " --force"), 0) << output_;
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_TRUE(fs::exists(out / "images" / "peer-1" / "test"));
  // An empty directory is not data to protect.
  fs::create_directories(root_ / "empty" / "tabular");
  EXPECT_EQ(Run("--out " + (root_ / "empty").string() + " --kind tabular"), 0) << output_;
}

TEST_F(ExampleDataTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(Run(Small(root_ / "a") + " --kind pictures"), 2);
  EXPECT_THAT(output_, HasSubstr("--kind"));
  EXPECT_EQ(Run("--peers 2"), 2);
  EXPECT_THAT(output_, HasSubstr("--out"));
  EXPECT_EQ(Run(Small(root_ / "a") + " --images-per-peer 5"), 2);
  EXPECT_EQ(Run(Small(root_ / "a") + " --fashion-mnist " + root_.string()), 1);
  EXPECT_THAT(output_, HasSubstr("train-images-idx3-ubyte.gz"));
  EXPECT_FALSE(fs::exists(root_ / "a"));
}

}  // namespace
}  // namespace shoal::data
