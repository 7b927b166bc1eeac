// Fashion-MNIST loading and partitioning on the real data set.

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/partition.h"

namespace shoal::training {
namespace {

using ::testing::HasSubstr;

const char kDataDir[] = "/usr/share/datasets/fashion-mnist";

// Loaded once: decompressing the training set takes a moment.
const RawDataset& Train() {
  static const RawDataset* train = [] {
    auto ds = LoadFashionMnist(kDataDir, Split::kTrain);
    EXPECT_TRUE(ds.ok()) << ds.status();
    return new RawDataset(ds.ok() ? *std::move(ds) : RawDataset{});
  }();
  return *train;
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(FashionMnistTest, LoadsTheRealTrainingAndTestSets) {
  const RawDataset& train = Train();
  ASSERT_EQ(train.count, 60000u);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  EXPECT_EQ(train.pixels.size(), 60000u * 784u);
  std::vector<int> per_class(10, 0);
  for (uint8_t l : train.labels) {
    ASSERT_LT(l, 10);
    ++per_class[l];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << "class " << c;

  auto test = LoadFashionMnist(kDataDir, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->count, 10000u);
  EXPECT_EQ(test->labels.size(), 10000u);
  EXPECT_TRUE(CheckFashionMnistDir(kDataDir).ok());
}

TEST(FashionMnistTest, LimitKeepsTheFirstSamples) {
  auto test = LoadFashionMnist(kDataDir, Split::kTest, 123);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->count, 123u);
  EXPECT_EQ(test->labels.size(), 123u);
  EXPECT_EQ(test->pixels.size(), 123u * 784u);
}

TEST(FashionMnistTest, MissingDirectoryIsNotFound) {
  auto ds = LoadFashionMnist("/nonexistent/fashion", Split::kTrain);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr("/nonexistent/fashion"));
  EXPECT_EQ(CheckFashionMnistDir("/nonexistent/fashion").code(), absl::StatusCode::kNotFound);
}

TEST(FashionMnistTest, MissingFileIsNotFoundNamingTheFile) {
  std::string dir = TempDir("shoal-fmnist-missing");
  auto ds = LoadFashionMnist(dir, Split::kTest);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr("t10k-images-idx3-ubyte.gz"));
  std::filesystem::remove_all(dir);
}

TEST(FashionMnistTest, BadMagicAndTruncationAreInvalidArgument) {
  std::string dir = TempDir("shoal-fmnist-bad");
  // Labels valid: magic 0x801, 2 labels.
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", std::string("\0\0\x08\x01\0\0\0\x02\x01\x02", 10));
  // Images with a wrong magic.
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz", std::string(16 + 2 * 4, '\x07'));
  auto ds = LoadFashionMnist(dir, Split::kTest);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(), HasSubstr("t10k-images-idx3-ubyte.gz"));
  EXPECT_THAT(ds.status().message(), HasSubstr("magic"));

  // Right magic, 2 images of 2x2 declared, but only 3 pixel bytes.
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz",
            std::string("\0\0\x08\x03\0\0\0\x02\0\0\0\x02\0\0\0\x02\x01\x02\x03", 19));
  ds = LoadFashionMnist(dir, Split::kTest);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(), HasSubstr("header says 2 images"));

  // Not gzip at all.
  { std::ofstream(dir + "/t10k-images-idx3-ubyte.gz") << "plain text, not gzip"; }
  ds = LoadFashionMnist(dir, Split::kTest);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST(ShardSpecTest, ParsesAndRejects) {
  auto s = ParseShardSpec("2/4", "--shard");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->index, 2u);
  EXPECT_EQ(s->count, 4u);
  EXPECT_EQ(s->ToString(), "2/4");
  for (const char* bad : {"4/4", "1/0", "x", "", "1/", "/4", "-1/4", "1/4/5", "a/b", "0/200000"}) {
    auto r = ParseShardSpec(bad, "--shard");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--shard")) << bad;
  }
}

common::v1::DatasetSpec Ds(common::v1::Partition partition, uint32_t classes_per_shard,
                           double alpha = 0) {
  common::v1::DatasetSpec d;
  d.set_partition(partition);
  d.set_classes_per_shard(classes_per_shard);
  d.set_alpha(alpha);
  return d;
}

void ExpectDisjointCover(const std::vector<std::vector<int64_t>>& shards, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& shard : shards) {
    for (int64_t i : shard) {
      ASSERT_GE(i, 0);
      ASSERT_LT(static_cast<size_t>(i), n);
      ++seen[i];
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
}

TEST(PartitionTest, IidShardsAreEqualDisjointCoveringAndSeeded) {
  const RawDataset& train = Train();
  std::vector<std::vector<int64_t>> shards;
  for (uint32_t i = 0; i < 4; ++i) {
    auto idx = PartitionIndices(train.labels, 10, Ds(common::v1::PARTITION_IID, 0), {i, 4}, 7);
    ASSERT_TRUE(idx.ok()) << idx.status();
    EXPECT_EQ(idx->size(), 15000u);
    // IID: every class is present in roughly its share (6000/4 = 1500).
    std::vector<int> per_class(10, 0);
    for (int64_t j : *idx) ++per_class[train.labels[j]];
    for (int c = 0; c < 10; ++c) EXPECT_NEAR(per_class[c], 1500, 200) << "class " << c;
    shards.push_back(*std::move(idx));
  }
  ExpectDisjointCover(shards, train.count);

  auto again = PartitionIndices(train.labels, 10, Ds(common::v1::PARTITION_IID, 0), {1, 4}, 7);
  EXPECT_EQ(*again, shards[1]);
  auto other = PartitionIndices(train.labels, 10, Ds(common::v1::PARTITION_IID, 0), {1, 4}, 8);
  EXPECT_NE(*other, shards[1]);
}

class LabelSkewTest : public ::testing::TestWithParam<std::pair<uint32_t, uint32_t>> {};

TEST_P(LabelSkewTest, ShardsSeeAboutKClassesAndCoverTheData) {
  const auto [n, k] = GetParam();
  const RawDataset& train = Train();
  std::vector<std::vector<int64_t>> shards;
  for (uint32_t i = 0; i < n; ++i) {
    auto idx =
        PartitionIndices(train.labels, 10, Ds(common::v1::PARTITION_LABEL_SKEW, k), {i, n}, 3);
    ASSERT_TRUE(idx.ok()) << idx.status();
    std::set<int> classes;
    for (int64_t j : *idx) classes.insert(train.labels[j]);
    // Exactly k classes when every class has a slot (n*k >= 10); otherwise the leftover classes
    // are dealt onto the slots, at most ceil(10 / (n*k)) classes per slot.
    const uint32_t slots = n * k;
    const uint32_t bound = slots >= 10 ? k : k * ((10 + slots - 1) / slots);
    EXPECT_LE(classes.size(), bound) << "shard " << i << "/" << n;
    EXPECT_GE(classes.size(), std::min<uint32_t>(k, 10)) << "shard " << i << "/" << n;
    shards.push_back(*std::move(idx));
  }
  ExpectDisjointCover(shards, train.count);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LabelSkewTest,
                         ::testing::Values(std::make_pair(4u, 2u), std::make_pair(5u, 2u),
                                           std::make_pair(10u, 1u), std::make_pair(3u, 4u),
                                           std::make_pair(8u, 3u)));

// Dirichlet shards: disjoint, covering, deterministic, and as skewed as alpha says: with a
// small alpha a shard's largest class dominates; with a large one shards look IID.
TEST(DirichletTest, ShardsCoverTheDataAndSkewFollowsAlpha) {
  const RawDataset& train = Train();
  auto largest_class_share = [&](double alpha, uint32_t n) {
    std::vector<std::vector<int64_t>> shards;
    double mean_share = 0;
    for (uint32_t i = 0; i < n; ++i) {
      auto idx = PartitionIndices(train.labels, 10, Ds(common::v1::PARTITION_DIRICHLET, 0, alpha),
                                  {i, n}, 11);
      EXPECT_TRUE(idx.ok()) << idx.status();
      if (!idx.ok()) return -1.0;
      EXPECT_GE(idx->size(), MinDirichletShardSamples(train.count, n));
      std::vector<uint64_t> h = LabelHistogram(train.labels, *idx, 10);
      uint64_t total = 0;
      for (uint64_t c : h) total += c;
      EXPECT_EQ(total, idx->size());
      mean_share += static_cast<double>(*std::max_element(h.begin(), h.end())) /
                    static_cast<double>(total) / n;
      shards.push_back(*std::move(idx));
    }
    ExpectDisjointCover(shards, train.count);
    return mean_share;
  };
  const double skewed = largest_class_share(0.1, 8);
  const double iid_like = largest_class_share(1000, 8);
  EXPECT_GT(skewed, 0.5);     // mostly one class per shard
  EXPECT_LT(iid_like, 0.12);  // each class about 1/10
  // The same seed gives the same split, another seed another one.
  const common::v1::DatasetSpec d = Ds(common::v1::PARTITION_DIRICHLET, 0, 0.5);
  EXPECT_EQ(*PartitionIndices(train.labels, 10, d, {3, 8}, 5),
            *PartitionIndices(train.labels, 10, d, {3, 8}, 5));
  EXPECT_NE(*PartitionIndices(train.labels, 10, d, {3, 8}, 5),
            *PartitionIndices(train.labels, 10, d, {3, 8}, 6));
}

TEST(DirichletTest, ImpossibleSplitsAndBadAlphaAreNamed) {
  // 20 samples over 8 shards at a tiny alpha: almost every draw leaves some shard short of
  // MinDirichletShardSamples (1 here).
  std::vector<uint8_t> labels(20, 0);
  absl::Status s =
      PartitionIndices(labels, 10, Ds(common::v1::PARTITION_DIRICHLET, 0, 0.001), {0, 8}, 1)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("raise alpha or use fewer shards"));
  s = PartitionIndices(labels, 10, Ds(common::v1::PARTITION_DIRICHLET, 0, 0), {0, 2}, 1).status();
  EXPECT_EQ(s.message(), "dataset.alpha must be > 0 and finite, got 0");
  EXPECT_EQ(MinDirichletShardSamples(60000, 8), 10u);
  EXPECT_EQ(MinDirichletShardSamples(100, 8), 6u);
  EXPECT_EQ(MinDirichletShardSamples(3, 8), 1u);
}

TEST(PartitionTest, RejectsBadArguments) {
  std::vector<uint8_t> labels(100, 1);
  EXPECT_EQ(
      PartitionIndices(labels, 10, Ds(common::v1::PARTITION_IID, 0), {4, 4}, 1).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionIndices(labels, 10, Ds(common::v1::PARTITION_LABEL_SKEW, 0), {0, 4}, 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionIndices(labels, 10, Ds(common::v1::PARTITION_LABEL_SKEW, 11), {0, 4}, 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // More shards than samples: some shard is empty.
  EXPECT_EQ(
      PartitionIndices(std::vector<uint8_t>(3, 0), 10, Ds(common::v1::PARTITION_IID, 0), {0, 4}, 1)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(PartitionTest, TestSliceIsEveryNthSample) {
  auto slice = TestSliceIndices(10, {1, 4});
  EXPECT_EQ(slice, (std::vector<int64_t>{1, 5, 9}));
  size_t total = 0;
  for (uint32_t i = 0; i < 4; ++i) total += TestSliceIndices(10000, {i, 4}).size();
  EXPECT_EQ(total, 10000u);
}

}  // namespace
}  // namespace shoal::training
