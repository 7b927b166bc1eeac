#include "libs/data/task_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/escape.h"
#include "libs/common/status_macros.h"
#include "libs/data/csv_dataset.h"
#include "libs/data/feature_moments.h"
#include "libs/data/idx_dataset.h"
#include "libs/data/image_folder.h"

namespace shoal::data {
namespace {

using common::v1::DatasetSpec;

constexpr double kDefaultTestFraction = 0.2;

std::string Resolve(const std::string& data_dir, const std::string& file) {
  const std::filesystem::path p(file);
  if (p.is_absolute() || data_dir.empty()) return p.string();
  return (std::filesystem::path(data_dir) / p).string();
}

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& in) {
  return {in.begin(), in.end()};
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Fisher-Yates over mt19937_64 alone, so every machine draws the same split.
void Shuffle(std::vector<size_t>& v, uint64_t seed) {
  std::mt19937_64 gen(seed ^ 0x7f4a7c159e3779b9ULL);
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(gen() % i);
    std::swap(v[i - 1], v[j]);
  }
}

Dataset Select(const Dataset& data, const std::vector<size_t>& rows) {
  Dataset out;
  out.sample_shape = data.sample_shape;
  out.class_names = data.class_names;
  out.feature_names = data.feature_names;
  const size_t size = data.SampleSize();
  out.count = rows.size();
  out.values.resize(rows.size() * size);
  out.labels.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(data.values.begin() + static_cast<std::ptrdiff_t>(rows[i] * size), size,
                out.values.begin() + static_cast<std::ptrdiff_t>(i * size));
    out.labels[i] = data.labels[rows[i]];
  }
  return out;
}

absl::StatusOr<Dataset> LoadOne(const DatasetSpec& spec, const std::string& path,
                                const std::string& labels_path) {
  switch (spec.format()) {
    case common::v1::DATA_FORMAT_CSV: {
      CsvOptions o;
      o.label_column = spec.label_column();
      o.feature_columns = Strings(spec.feature_columns());
      o.classes = Strings(spec.classes());
      o.num_classes = spec.classes().empty() ? spec.num_classes() : 0;
      return LoadCsv(path, o);
    }
    case common::v1::DATA_FORMAT_IDX: {
      IdxOptions o;
      o.classes = Strings(spec.classes());
      o.num_classes = static_cast<uint32_t>(TaskClassCount(spec));
      return LoadIdx(path, labels_path, o);
    }
    case common::v1::DATA_FORMAT_IMAGE_FOLDER: {
      ImageFolderOptions o;
      o.height = static_cast<int>(spec.image_size(0));
      o.width = static_cast<int>(spec.image_size(spec.image_size_size() > 1 ? 1 : 0));
      o.channels = static_cast<int>(spec.channels());
      o.classes = Strings(spec.classes());
      o.allow_missing_classes = true;  // a peer's own images need not cover every class
      for (double m : spec.mean()) o.mean.push_back(static_cast<float>(m));
      for (double s : spec.std()) o.std.push_back(static_cast<float>(s));
      return LoadImageFolder(path, o);
    }
    default:
      return absl::InvalidArgumentError("dataset.format: not a format of the peer's own files");
  }
}

// Standardises CSV features and image channels: the task's statistics, or those of this peer's
// training data (standardize-local). Standardize without the task's statistics leaves the data
// as loaded for the federation's (awaits_statistics). An image folder's loader has already
// scaled its pixels by the task's mean/std (or only to [0, 1]) unless normalization asks for
// statistics of the data.
absl::Status Standardize(const DatasetSpec& spec, TaskData& data) {
  const bool images = spec.format() == common::v1::DATA_FORMAT_IMAGE_FOLDER;
  if ((spec.format() != common::v1::DATA_FORMAT_CSV && !images) ||
      spec.normalization() == common::v1::NORMALIZATION_NONE) {
    return absl::OkStatus();
  }
  if (images &&
      (spec.normalization() == common::v1::NORMALIZATION_UNSPECIFIED || spec.mean_size() > 0)) {
    return absl::OkStatus();
  }
  if (spec.normalization() != common::v1::NORMALIZATION_STANDARDIZE_LOCAL &&
      spec.mean_size() == 0) {
    data.awaits_statistics = true;
    return absl::OkStatus();
  }
  Standardization s;
  if (spec.mean_size() > 0) {
    const size_t features = data.train.SampleSize();
    if (static_cast<size_t>(spec.mean_size()) != features ||
        static_cast<size_t>(spec.std_size()) != features) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.mean and dataset.std: the task gives ", spec.mean_size(), " and ",
                       spec.std_size(), " values, but the data has ", features, " features (",
                       absl::StrJoin(data.train.feature_names, ", "), ")"));
    }
    s.mean.assign(spec.mean().begin(), spec.mean().end());
    s.stddev.assign(spec.std().begin(), spec.std().end());
  } else {
    SHOAL_ASSIGN_OR_RETURN(s, ComputeStandardization(data.train));
  }
  SHOAL_RETURN_IF_ERROR(ApplyStandardization(s, data.train));
  return ApplyStandardization(s, data.test);
}

}  // namespace

absl::Status StandardizeTaskData(const FeatureStatistics& statistics, TaskData& data) {
  if (!data.awaits_statistics) {
    return absl::FailedPreconditionError(
        "the task's data does not await the federation's statistics");
  }
  const size_t features = data.train.FeatureCount();
  if (statistics.mean.size() != features || statistics.stddev.size() != features) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the federation's statistics give ", statistics.mean.size(), " means and ",
        statistics.stddev.size(), " standard deviations, but the data has ", features,
        data.train.IsImage()
            ? " channels"
            : absl::StrCat(" features (", absl::StrJoin(data.train.feature_names, ", "), ")")));
  }
  Standardization s;
  s.mean.assign(statistics.mean.begin(), statistics.mean.end());
  s.stddev.assign(statistics.stddev.begin(), statistics.stddev.end());
  // Both splits are checked before either changes (without a copy of either): on error the
  // data stay as loaded.
  SHOAL_RETURN_IF_ERROR(CheckStandardization(s, data.train));
  SHOAL_RETURN_IF_ERROR(CheckStandardization(s, data.test));
  SHOAL_RETURN_IF_ERROR(ApplyStandardization(s, data.train));
  SHOAL_RETURN_IF_ERROR(ApplyStandardization(s, data.test));
  data.awaits_statistics = false;
  return absl::OkStatus();
}

bool UsesOwnFiles(const DatasetSpec& dataset) {
  return dataset.format() == common::v1::DATA_FORMAT_IDX ||
         dataset.format() == common::v1::DATA_FORMAT_CSV ||
         dataset.format() == common::v1::DATA_FORMAT_IMAGE_FOLDER;
}

int TaskClassCount(const DatasetSpec& dataset) {
  if (!UsesOwnFiles(dataset)) return 10;
  if (!dataset.classes().empty()) return dataset.classes_size();
  return static_cast<int>(dataset.num_classes());
}

absl::Status HoldOut(Dataset& data, double fraction, uint64_t seed, Dataset& test) {
  if (data.count < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot hold out a test set from ", data.count,
                     " sample(s); give dataset.test or more training data"));
  }
  std::vector<size_t> rows(data.count);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = i;
  Shuffle(rows, seed);
  size_t n_test = static_cast<size_t>(std::ceil(fraction * static_cast<double>(data.count)));
  n_test = std::clamp<size_t>(n_test, 1, data.count - 1);
  std::vector<size_t> test_rows(rows.end() - static_cast<std::ptrdiff_t>(n_test), rows.end());
  rows.resize(data.count - n_test);
  // Keep the file order within each side, so the order does not depend on the shuffle.
  std::sort(rows.begin(), rows.end());
  std::sort(test_rows.begin(), test_rows.end());
  test = Select(data, test_rows);
  data = Select(data, rows);
  return absl::OkStatus();
}

absl::StatusOr<TaskData> LoadTaskData(const DatasetSpec& spec, const std::string& data_dir,
                                      uint64_t seed) {
  if (!UsesOwnFiles(spec)) {
    return absl::InvalidArgumentError(
        "dataset.format: fashion-mnist is not loaded from files here");
  }
  if (spec.format() == common::v1::DATA_FORMAT_IMAGE_FOLDER && spec.image_size().empty()) {
    return absl::InvalidArgumentError("dataset.image_size: required for image-folder");
  }
  TaskData data;
  const std::string train_path = Resolve(data_dir, spec.train());
  SHOAL_ASSIGN_OR_RETURN(data.train,
                         LoadOne(spec, train_path, Resolve(data_dir, spec.train_labels())));
  std::string test_path;
  if (!spec.test().empty()) {
    test_path = Resolve(data_dir, spec.test());
    SHOAL_ASSIGN_OR_RETURN(data.test,
                           LoadOne(spec, test_path, Resolve(data_dir, spec.test_labels())));
    if (data.test.sample_shape != data.train.sample_shape ||
        data.test.feature_names != data.train.feature_names) {
      return absl::InvalidArgumentError(absl::StrCat(
          EscapeBytes(test_path), ": its samples (", Shape(data.test.sample_shape),
          data.test.feature_names.empty()
              ? ""
              : absl::StrCat(": ", absl::StrJoin(data.test.feature_names, ", ")),
          ") differ from the training data's ", Shape(data.train.sample_shape),
          data.train.feature_names.empty()
              ? ""
              : absl::StrCat(" (", absl::StrJoin(data.train.feature_names, ", "), ")")));
    }
  } else {
    const double fraction = spec.test_fraction() > 0 ? spec.test_fraction() : kDefaultTestFraction;
    SHOAL_RETURN_IF_ERROR(HoldOut(data.train, fraction, seed, data.test));
    data.test_held_out = true;
  }
  const int classes = TaskClassCount(spec);
  if (static_cast<int>(data.train.class_names.size()) != classes) {
    return absl::InvalidArgumentError(
        absl::StrCat(EscapeBytes(train_path), ": the data has ", data.train.class_names.size(),
                     " classes, the task ", classes, " (dataset.classes or dataset.num_classes)"));
  }
  SHOAL_RETURN_IF_ERROR(Standardize(spec, data));
  data.summary = absl::StrCat(
      EscapeBytes(train_path), ": ", data.train.count, " training samples of shape ",
      Shape(data.train.sample_shape), "; ",
      data.test_held_out
          ? absl::StrCat(data.test.count, " held out for testing")
          : absl::StrCat(EscapeBytes(test_path), ": ", data.test.count, " test samples"));
  return data;
}

}  // namespace shoal::data
