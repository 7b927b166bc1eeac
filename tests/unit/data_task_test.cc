// A task's data set from its DatasetSpec (libs/data/task_data.h): the format's loader, the
// held-out test split, standardisation with the peer's own, the task's or the federation's
// statistics (moments added up over peers), and the checks that the files fit the task.

// The image tests write their PNGs with stb_image_write (libstb.so holds its implementation).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/data/csv_dataset.h"
#include "libs/data/feature_moments.h"
#include "libs/data/task_data.h"

namespace shoal::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class TaskDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("shoal-taskdata-", ::getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // x in 0..9 (label x % 2), y = 100 + 10 x.
    std::string table = "x,y,label\n";
    for (int i = 0; i < 10; ++i) absl::StrAppend(&table, i, ",", 100 + 10 * i, ",", i % 2, "\n");
    Write("train.csv", table);
    Write("test.csv", "x,y,label\n4,140,0\n5,150,1\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  common::v1::DatasetSpec Csv() const {
    common::v1::DatasetSpec d;
    d.set_format(common::v1::DATA_FORMAT_CSV);
    d.set_train("train.csv");
    d.set_test("test.csv");
    d.set_label_column("label");
    d.set_num_classes(2);
    d.set_normalization(common::v1::NORMALIZATION_NONE);
    return d;
  }
  // An image folder of 2 x 2 RGB images with known pixels: images 0 and 1 of class a, 2 and 3
  // of class b under train/, image 4 of class a under test/. Channel 0 varies with the image and
  // the pixel, channel 1 is constant, channel 2 is black and white.
  static uint8_t Pixel(int image, int channel, int pixel) {
    if (channel == 0) return static_cast<uint8_t>(10 * (4 * image + pixel));
    return channel == 1 ? 51 : (pixel % 2 == 0 ? 0 : 255);
  }
  common::v1::DatasetSpec Images() {
    for (int image = 0; image < 5; ++image) {
      std::vector<uint8_t> interleaved;
      for (int pixel = 0; pixel < 4; ++pixel) {
        for (int c = 0; c < 3; ++c) interleaved.push_back(Pixel(image, c, pixel));
      }
      const std::filesystem::path path = dir_ /
                                         (image == 4  ? "test/a"
                                          : image < 2 ? "train/a"
                                                      : "train/b") /
                                         absl::StrCat(image, ".png");
      std::filesystem::create_directories(path.parent_path());
      EXPECT_NE(stbi_write_png(path.c_str(), 2, 2, 3, interleaved.data(), 0), 0) << path;
    }
    common::v1::DatasetSpec d;
    d.set_format(common::v1::DATA_FORMAT_IMAGE_FOLDER);
    d.set_train("train");
    d.set_test("test");
    d.add_classes("a");
    d.add_classes("b");
    d.add_image_size(2);
    d.set_channels(3);
    return d;
  }
  std::filesystem::path dir_;
};

TEST_F(TaskDataTest, ReadsTheFilesFromTheDataDirectory) {
  absl::StatusOr<TaskData> data = LoadTaskData(Csv(), dir_.string(), 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train.count, 10u);
  EXPECT_EQ(data->test.count, 2u);
  EXPECT_FALSE(data->test_held_out);
  EXPECT_EQ(data->train.sample_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(data->test.values, (std::vector<float>{4, 140, 5, 150}));
  EXPECT_THAT(data->summary, AllOf(HasSubstr("10 training samples"), HasSubstr("2 test")));
  EXPECT_TRUE(UsesOwnFiles(Csv()));
  EXPECT_EQ(TaskClassCount(Csv()), 2);
}

TEST_F(TaskDataTest, StandardisesWithThePeersOwnStatisticsOrTheTasks) {
  common::v1::DatasetSpec d = Csv();
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE_LOCAL);
  absl::StatusOr<TaskData> own = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(own.ok()) << own.status();
  // x has mean 4.5 over the training file; the test file is scaled by the same statistics.
  double mean = 0;
  for (size_t i = 0; i < own->train.count; ++i) mean += own->train.values[2 * i];
  EXPECT_NEAR(mean / 10, 0, 1e-6);
  EXPECT_NEAR(own->test.values[0], (4 - 4.5) / std::sqrt(8.25), 1e-5);

  EXPECT_FALSE(own->awaits_statistics);

  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  d.add_mean(0);
  d.add_mean(100);
  d.add_std(2);
  d.add_std(10);
  absl::StatusOr<TaskData> given = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->test.values, (std::vector<float>{2, 4, 2.5, 5}));

  d.clear_mean();
  d.clear_std();
  d.add_mean(0);
  d.add_std(1);
  absl::StatusOr<TaskData> wrong = LoadTaskData(d, dir_.string(), 1);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), AllOf(HasSubstr("dataset.mean"), HasSubstr("2 features")));
}

// Standardize without the task's statistics: the data stay as loaded until the federation's
// statistics come, which then scale both splits.
TEST_F(TaskDataTest, StandardizeWithoutStatisticsAwaitsTheFederations) {
  common::v1::DatasetSpec d = Csv();
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  absl::StatusOr<TaskData> data = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->awaits_statistics);
  EXPECT_EQ(data->test.values, (std::vector<float>{4, 140, 5, 150}));

  FeatureStatistics wrong{{0}, {1}};
  absl::Status s = StandardizeTaskData(wrong, *data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("1 means"), HasSubstr("2 features (x, y)")));
  // Statistics that push a value out of float's range: neither split changes.
  s = StandardizeTaskData(FeatureStatistics{{0, -3e38}, {1, 1e-30}}, *data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data->train.values[1], 100);
  EXPECT_EQ(data->test.values, (std::vector<float>{4, 140, 5, 150}));
  EXPECT_TRUE(data->awaits_statistics);

  ASSERT_TRUE(StandardizeTaskData(FeatureStatistics{{4, 100}, {2, 20}}, *data).ok());
  EXPECT_FALSE(data->awaits_statistics);
  EXPECT_EQ(data->test.values, (std::vector<float>{0, 2, 0.5, 2.5}));
  EXPECT_EQ(data->train.values[0], -2);  // x = 0
  EXPECT_EQ(StandardizeTaskData(FeatureStatistics{{4, 100}, {2, 20}}, *data).code(),
            absl::StatusCode::kFailedPrecondition);
}

// The federation's statistics from moments added up over peers whose shares differ in size are
// those of the pooled data, as one peer holding all of it computes them.
TEST_F(TaskDataTest, MomentsAddedUpOverUnevenSharesGiveThePooledStatistics) {
  Dataset all;
  all.sample_shape = {3};
  all.class_names = {"a"};
  for (int i = 0; i < 50; ++i) {
    // A skewed feature, one with a large offset (rpm-like) and a constant one.
    all.values.insert(all.values.end(),
                      {static_cast<float>(i * i % 17), 1.0e6f + (i % 7) * 0.5f, 3.0f});
    all.labels.push_back(0);
  }
  all.count = 50;
  std::vector<int64_t> every(50);
  for (int64_t i = 0; i < 50; ++i) every[static_cast<size_t>(i)] = i;
  absl::StatusOr<Standardization> pooled = ComputeStandardization(all);
  ASSERT_TRUE(pooled.ok()) << pooled.status();

  FeatureMoments total;
  for (auto [from, to] : {std::pair{0, 3}, std::pair{3, 40}, std::pair{40, 50}}) {
    std::vector<int64_t> rows(every.begin() + from, every.begin() + to);
    absl::StatusOr<FeatureMoments> part = ComputeMoments(all, rows);
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_EQ(part->count, static_cast<uint64_t>(to - from));
    ASSERT_TRUE(AddMoments(total, *part).ok());
  }
  EXPECT_EQ(total.count, 50u);
  absl::StatusOr<FeatureStatistics> fed = StatisticsFromMoments(total);
  ASSERT_TRUE(fed.ok()) << fed.status();
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_NEAR(fed->mean[j], pooled->mean[j], 1e-6 * std::max(1.0f, std::fabs(pooled->mean[j])))
        << j;
    EXPECT_NEAR(fed->stddev[j], pooled->stddev[j], 1e-5 * pooled->stddev[j]) << j;
  }
  EXPECT_EQ(fed->stddev[2], 1.0) << "a constant feature maps to 0";

  EXPECT_EQ(ComputeMoments(all, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeMoments(all, {50}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = AddMoments(total, FeatureMoments{1, {1}, {1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1 features, but the others have 3"));
  EXPECT_EQ(total.count, 50u);
  EXPECT_EQ(StatisticsFromMoments(FeatureMoments{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An image folder's federation statistics are per channel, over every pixel of the training
// images (scaled to [0, 1]); count stays the number of images.
TEST_F(TaskDataTest, ImageMomentsArePerChannelOverEveryPixel) {
  common::v1::DatasetSpec d = Images();
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  absl::StatusOr<TaskData> data = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->awaits_statistics);
  ASSERT_EQ(data->train.count, 4u);
  EXPECT_EQ(data->train.FeatureCount(), 3u);
  EXPECT_EQ(data->train.ValuesPerFeature(), 4u);
  EXPECT_EQ(data->train.values[1], Pixel(0, 0, 1) / 255.0f);  // as loaded: in [0, 1]

  absl::StatusOr<FeatureMoments> moments = ComputeMoments(data->train, {0, 1, 2, 3});
  ASSERT_TRUE(moments.ok()) << moments.status();
  EXPECT_EQ(moments->count, 4u);
  ASSERT_EQ(moments->sum.size(), 3u);
  for (int c = 0; c < 3; ++c) {
    double sum = 0, squares = 0;  // over the 16 pixels of the channel
    for (int image = 0; image < 4; ++image) {
      for (int pixel = 0; pixel < 4; ++pixel) {
        const double x = Pixel(image, c, pixel) / 255.0f;
        sum += x;
        squares += x * x;
      }
    }
    EXPECT_NEAR(moments->sum[c], sum / 4, 1e-12) << c;
    EXPECT_NEAR(moments->sum_squares[c], squares / 4, 1e-12) << c;
  }
  // Channel 0: pixels 0, 10, ..., 150 (/ 255): mean 75/255, population std sqrt(2125)/255.
  absl::StatusOr<FeatureStatistics> stats = StatisticsFromMoments(*moments);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NEAR(stats->mean[0], 75.0 / 255, 1e-7);
  EXPECT_NEAR(stats->stddev[0], std::sqrt(2125.0) / 255, 1e-7);
  EXPECT_NEAR(stats->mean[1], 0.2, 1e-7);
  EXPECT_EQ(stats->stddev[1], 1.0) << "a constant channel maps to 0";
  EXPECT_NEAR(stats->mean[2], 0.5, 1e-7);
  EXPECT_NEAR(stats->stddev[2], 0.5, 1e-7);

  // Two peers' shares add up to the same statistics.
  FeatureMoments total;
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{0}, std::vector<int64_t>{1, 2, 3}}) {
    absl::StatusOr<FeatureMoments> part = ComputeMoments(data->train, rows);
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_TRUE(AddMoments(total, *part).ok());
  }
  absl::StatusOr<FeatureStatistics> added = StatisticsFromMoments(total);
  ASSERT_TRUE(added.ok()) << added.status();
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(added->mean[c], stats->mean[c], 1e-12) << c;
    EXPECT_NEAR(added->stddev[c], stats->stddev[c], 1e-12) << c;
  }

  absl::Status s = StandardizeTaskData(FeatureStatistics{{0, 0}, {1, 1}}, *data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("3 channels"));
  ASSERT_TRUE(StandardizeTaskData(*stats, *data).ok());
  // Test image 4, channel 0, pixel 2 (value 180): planar, so index 2.
  EXPECT_NEAR(data->test.values[2], (180.0 - 75) / std::sqrt(2125.0), 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(data->test.values[4 + i], 0.0f);  // constant channel
  EXPECT_NEAR(data->test.values[8], -1.0, 1e-6);                          // channel 2, black
}

// Image folders: without normalization (the default) pixels are only scaled to [0, 1], or by
// the task's mean/std; standardize-local with the peer's own per-channel statistics.
TEST_F(TaskDataTest, ImageNormalizationsOtherThanTheFederations) {
  common::v1::DatasetSpec d = Images();
  absl::StatusOr<TaskData> plain = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->awaits_statistics);
  EXPECT_EQ(plain->test.values[2], 180 / 255.0f);

  d.add_mean(0.5);
  d.add_mean(0.2);
  d.add_mean(0.5);
  for (int c = 0; c < 3; ++c) d.add_std(0.25);
  for (auto n : {common::v1::NORMALIZATION_UNSPECIFIED, common::v1::NORMALIZATION_STANDARDIZE}) {
    d.set_normalization(n);
    absl::StatusOr<TaskData> given = LoadTaskData(d, dir_.string(), 1);
    ASSERT_TRUE(given.ok()) << given.status();
    EXPECT_FALSE(given->awaits_statistics);  // the task's mean/std win
    EXPECT_NEAR(given->test.values[2], (180 / 255.0 - 0.5) / 0.25, 1e-5);
  }

  d.clear_mean();
  d.clear_std();
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE_LOCAL);
  absl::StatusOr<TaskData> local = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->awaits_statistics);
  EXPECT_NEAR(local->test.values[2], (180.0 - 75) / std::sqrt(2125.0), 1e-5);
  EXPECT_EQ(local->test.values[4], 0.0f);  // the constant channel
  double train_mean = 0;
  for (int i = 0; i < 4; ++i) {
    for (int p = 0; p < 4; ++p) train_mean += local->train.values[i * 12 + 8 + p];
  }
  EXPECT_NEAR(train_mean, 0, 1e-5);  // channel 2 over the training pixels

  d.set_normalization(common::v1::NORMALIZATION_NONE);
  absl::StatusOr<TaskData> none = LoadTaskData(d, dir_.string(), 1);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->test.values, plain->test.values);
}

TEST_F(TaskDataTest, WithoutATestFileAFractionIsHeldOutTheSameWayEveryTime) {
  common::v1::DatasetSpec d = Csv();
  d.clear_test();
  d.set_test_fraction(0.3);
  absl::StatusOr<TaskData> a = LoadTaskData(d, dir_.string(), 7);
  absl::StatusOr<TaskData> b = LoadTaskData(d, dir_.string(), 7);
  absl::StatusOr<TaskData> c = LoadTaskData(d, dir_.string(), 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(a->test_held_out);
  EXPECT_EQ(a->train.count, 7u);
  EXPECT_EQ(a->test.count, 3u);
  EXPECT_EQ(a->test.values, b->test.values);
  EXPECT_NE(a->test.values, c->test.values);
  // Together the two sides hold every row once.
  std::vector<float> xs;
  for (const Dataset* part : {&a->train, &a->test}) {
    for (size_t i = 0; i < part->count; ++i) xs.push_back(part->values[2 * i]);
  }
  std::sort(xs.begin(), xs.end());
  EXPECT_EQ(xs, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));

  Dataset one;
  one.count = 1;
  one.sample_shape = {1};
  one.values = {1};
  one.labels = {0};
  Dataset test;
  EXPECT_EQ(HoldOut(one, 0.5, 1, test).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TaskDataTest, FilesThatDoNotFitTheTaskAreRefusedNamingThem) {
  Write("other.csv", "x,z,label\n1,2,0\n");
  common::v1::DatasetSpec d = Csv();
  d.set_test("other.csv");
  absl::StatusOr<TaskData> data = LoadTaskData(d, dir_.string(), 1);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), AllOf(HasSubstr("other.csv"), HasSubstr("x, z")));

  d = Csv();
  d.set_num_classes(3);  // the file's labels are 0 and 1 only: the class count is the task's
  EXPECT_TRUE(LoadTaskData(d, dir_.string(), 1).ok());
  d.set_num_classes(0);
  d.add_classes("even");  // string classes, but the file has integer labels
  d.add_classes("odd");
  EXPECT_EQ(LoadTaskData(d, dir_.string(), 1).status().code(), absl::StatusCode::kInvalidArgument);

  d = Csv();
  d.set_train("missing.csv");
  data = LoadTaskData(d, dir_.string(), 1);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("missing.csv"));
}

// Any IDX data set (here Fashion-MNIST's test files, read through the generic IDX loader).
TEST_F(TaskDataTest, IdxFilesLoadAsImagesWithAHeldOutTestSplit) {
  common::v1::DatasetSpec d;
  d.set_format(common::v1::DATA_FORMAT_IDX);
  d.set_train("t10k-images-idx3-ubyte.gz");
  d.set_train_labels("t10k-labels-idx1-ubyte.gz");
  d.set_num_classes(10);
  d.set_test_fraction(0.1);
  absl::StatusOr<TaskData> data = LoadTaskData(d, "/usr/share/datasets/fashion-mnist", 3);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train.count, 9000u);
  EXPECT_EQ(data->test.count, 1000u);
  EXPECT_EQ(data->train.sample_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(data->train.class_names.size(), 10u);
}

}  // namespace
}  // namespace shoal::data
