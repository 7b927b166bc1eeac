#include "libs/training/shard_tensors.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/training/partition.h"

namespace shoal::training {
namespace {

// Fashion-MNIST pixel statistics (of x / 255) used to normalise the inputs.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

// The task's train_limit / test_limit: only the first `limit` samples (0 = all), identically
// on every peer, before partitioning.
size_t Limited(size_t count, uint32_t limit) { return limit > 0 && limit < count ? limit : count; }

absl::StatusOr<std::vector<int64_t>> TestSlice(size_t test_count, const ShardSpec& shard) {
  std::vector<int64_t> test_idx = TestSliceIndices(test_count, shard);
  if (test_idx.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard.ToString(), " gets no test samples out of ", test_count));
  }
  return test_idx;
}

std::pair<torch::Tensor, torch::Tensor> RawToTensors(const RawDataset& raw,
                                                     const std::vector<int64_t>& indices) {
  const int64_t n = static_cast<int64_t>(indices.size());
  const size_t image = raw.image_size();
  torch::Tensor images = torch::empty({n, 1, raw.rows, raw.cols}, torch::kFloat32);
  torch::Tensor labels = torch::empty({n}, torch::kInt64);
  float* dst = images.data_ptr<float>();
  int64_t* lab = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = raw.pixels.data() + static_cast<size_t>(indices[i]) * image;
    for (size_t p = 0; p < image; ++p) {
      dst[i * image + p] = (static_cast<float>(src[p]) / 255.0f - kPixelMean) / kPixelStd;
    }
    lab[i] = raw.labels[indices[i]];
  }
  return {images, labels};
}

std::pair<torch::Tensor, torch::Tensor> DatasetToTensors(const data::Dataset& d,
                                                         const std::vector<int64_t>& indices) {
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<int64_t> shape = {n};
  shape.insert(shape.end(), d.sample_shape.begin(), d.sample_shape.end());
  torch::Tensor x = torch::empty(shape, torch::kFloat32);
  torch::Tensor y = torch::empty({n}, torch::kInt64);
  const size_t size = d.SampleSize();
  float* dst = x.data_ptr<float>();
  int64_t* lab = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + static_cast<size_t>(i) * size,
                d.values.data() + static_cast<size_t>(indices[i]) * size, size * sizeof(float));
    lab[i] = d.labels[static_cast<size_t>(indices[i])];
  }
  return {x, y};
}

struct Indices {
  std::vector<int64_t> train;  // this shard's training samples
  std::vector<int64_t> test;   // its test slice
};

// The task's limits and partition applied to the full training labels (the same computation on
// every peer), and the test slice; fills out.num_classes and out.label_histogram.
template <typename Label>
absl::StatusOr<Indices> ShardIndices(const TrainerOptions& options,
                                     const std::vector<Label>& all_labels, int classes,
                                     size_t train_count, size_t test_count, ShardTensors& out) {
  const auto& ds = options.spec.dataset();
  const std::vector<Label> labels(
      all_labels.begin(),
      all_labels.begin() + static_cast<std::ptrdiff_t>(Limited(train_count, ds.train_limit())));
  Indices idx;
  SHOAL_ASSIGN_OR_RETURN(idx.train,
                         TrainShardIndices(options.spec, options.shard, labels, classes));
  SHOAL_ASSIGN_OR_RETURN(idx.test, TestSlice(Limited(test_count, ds.test_limit()), options.shard));
  out.num_classes = classes;
  out.label_histogram = LabelHistogram(labels, idx.train, classes);
  return idx;
}

}  // namespace

absl::StatusOr<ShardTensors> MakeShardTensors(const TrainerOptions& options,
                                              const RawDataset& train, const RawDataset& test) {
  ShardTensors out;
  SHOAL_ASSIGN_OR_RETURN(Indices idx, ShardIndices(options, train.labels, kFashionMnistClasses,
                                                   train.count, test.count, out));
  std::tie(out.train_x, out.train_y) = RawToTensors(train, idx.train);
  std::tie(out.test_x, out.test_y) = RawToTensors(test, idx.test);
  return out;
}

absl::StatusOr<ShardTensors> MakeShardTensors(const TrainerOptions& options,
                                              const data::Dataset& train,
                                              const data::Dataset& test) {
  if (train.class_names.empty() || test.class_names.size() != train.class_names.size() ||
      test.sample_shape != train.sample_shape) {
    return absl::InvalidArgumentError(
        "the training and test data differ in their classes or sample shape");
  }
  ShardTensors out;
  SHOAL_ASSIGN_OR_RETURN(
      Indices idx, ShardIndices(options, train.labels, static_cast<int>(train.class_names.size()),
                                train.count, test.count, out));
  std::tie(out.train_x, out.train_y) = DatasetToTensors(train, idx.train);
  std::tie(out.test_x, out.test_y) = DatasetToTensors(test, idx.test);
  return out;
}

}  // namespace shoal::training
