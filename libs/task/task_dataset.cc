#include "libs/task/task_dataset.h"

#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/status_macros.h"
#include "libs/task/task_file.h"

namespace shoal::task {
namespace {

using common::v1::DatasetSpec;

constexpr uint32_t kDefaultClassesPerShard = 2;
constexpr double kDefaultDirichletAlpha = 0.5;
constexpr double kDefaultTestFraction = 0.2;
constexpr uint32_t kMaxClasses = 65'536;  // what a peer's DataReport may carry
constexpr uint32_t kMaxImageSide = 4096;

absl::Status DatasetFieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("dataset.", field, ": ", what));
}

bool OwnFiles(const DatasetSpec& d) {
  return d.format() == common::v1::DATA_FORMAT_IDX || d.format() == common::v1::DATA_FORMAT_CSV ||
         d.format() == common::v1::DATA_FORMAT_IMAGE_FOLDER;
}

std::string FormatName(const DatasetSpec& d) {
  return FriendlyEnumName(*common::v1::DataFormat_descriptor(), d.format());
}

// The fields of the peer's own files, which Fashion-MNIST tasks must leave out.
absl::Status NoOwnFileFields(const DatasetSpec& d) {
  const char* used = "used only by formats idx, csv and image-folder";
  if (!d.train().empty()) return DatasetFieldError("train", used);
  if (!d.train_labels().empty()) return DatasetFieldError("train_labels", used);
  if (!d.test().empty()) return DatasetFieldError("test", used);
  if (!d.test_labels().empty()) return DatasetFieldError("test_labels", used);
  if (d.test_fraction() != 0) return DatasetFieldError("test_fraction", used);
  if (!d.label_column().empty())
    return DatasetFieldError("label_column", "used only by format csv");
  if (!d.feature_columns().empty())
    return DatasetFieldError("feature_columns", "used only by format csv");
  if (!d.classes().empty()) return DatasetFieldError("classes", used);
  if (d.num_classes() != 0) return DatasetFieldError("num_classes", used);
  if (d.normalization() != common::v1::NORMALIZATION_UNSPECIFIED) {
    return DatasetFieldError("normalization", "used only by formats csv and image-folder");
  }
  if (!d.mean().empty() || !d.std().empty()) return DatasetFieldError("mean", used);
  if (!d.image_size().empty())
    return DatasetFieldError("image_size", "used only by format image-folder");
  if (d.channels() != 0) return DatasetFieldError("channels", "used only by format image-folder");
  return absl::OkStatus();
}

absl::Status CheckNames(const google::protobuf::RepeatedPtrField<std::string>& names,
                        absl::string_view field) {
  std::set<std::string> seen;
  for (int i = 0; i < names.size(); ++i) {
    if (names[i].empty())
      return DatasetFieldError(absl::StrCat(field, "[", i, "]"), "must not be empty");
    if (!seen.insert(names[i]).second) {
      return DatasetFieldError(field, absl::StrCat("names ", QuoteBytes(names[i]), " twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMeanStd(const DatasetSpec& d, int expected_size, absl::string_view per) {
  if (d.mean_size() != d.std_size()) {
    return DatasetFieldError("std", absl::StrCat("gives ", d.std_size(), " values but mean gives ",
                                                 d.mean_size(), " (both or neither)"));
  }
  if (expected_size > 0 && d.mean_size() > 0 && d.mean_size() != expected_size) {
    return DatasetFieldError("mean", absl::StrCat("needs one value per ", per, " (", expected_size,
                                                  "), got ", d.mean_size()));
  }
  for (int i = 0; i < d.std_size(); ++i) {
    if (!(d.std(i) > 0) || !std::isfinite(d.std(i)) || !std::isfinite(d.mean(i))) {
      return DatasetFieldError(absl::StrCat("std[", i, "]"),
                               "every mean must be finite and every std > 0 and finite");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOwnFiles(const DatasetSpec& d) {
  if (!d.name().empty() && !IsValidName(d.name())) {
    return DatasetFieldError("name", absl::StrCat("must match ", kNamePattern,
                                                  " (or be left out), got ", QuoteBytes(d.name())));
  }
  const bool csv = d.format() == common::v1::DATA_FORMAT_CSV;
  const bool idx = d.format() == common::v1::DATA_FORMAT_IDX;
  const bool images = d.format() == common::v1::DATA_FORMAT_IMAGE_FOLDER;
  if (d.train().empty()) {
    return DatasetFieldError("train", absl::StrCat("required for format ", FormatName(d),
                                                   images ? " (the training images' directory)"
                                                          : " (the training file)"));
  }
  if (idx && d.train_labels().empty()) {
    return DatasetFieldError("train_labels", "required for format idx (the training labels file)");
  }
  if (idx && d.test().empty() != d.test_labels().empty()) {
    return DatasetFieldError("test_labels", "give both test and test_labels, or neither");
  }
  if (!idx && (!d.train_labels().empty() || !d.test_labels().empty())) {
    return DatasetFieldError(d.train_labels().empty() ? "test_labels" : "train_labels",
                             "used only by format idx");
  }
  if (!d.test().empty() && d.test_fraction() != 0) {
    return DatasetFieldError("test_fraction", "used only without dataset.test");
  }
  if (d.test().empty() && !(d.test_fraction() > 0 && d.test_fraction() <= 0.9)) {
    return DatasetFieldError(
        "test_fraction", absl::StrCat("must be in (0, 0.9], got ", JsonNumber(d.test_fraction())));
  }
  if (csv && d.label_column().empty()) {
    return DatasetFieldError("label_column", "required for format csv (the label column's header)");
  }
  if (!csv && !d.label_column().empty())
    return DatasetFieldError("label_column", "used only by format csv");
  if (!csv && !d.feature_columns().empty()) {
    return DatasetFieldError("feature_columns", "used only by format csv");
  }
  SHOAL_RETURN_IF_ERROR(CheckNames(d.classes(), "classes"));
  SHOAL_RETURN_IF_ERROR(CheckNames(d.feature_columns(), "feature_columns"));
  if (d.classes_size() > static_cast<int>(kMaxClasses)) {
    return DatasetFieldError("classes", absl::StrCat("at most ", kMaxClasses, " classes"));
  }
  if (images && d.classes().empty()) {
    return DatasetFieldError(
        "classes",
        "required for format image-folder: the class directories' names in label "
        "order (every peer must number the classes alike)");
  }
  if (!d.classes().empty() && d.num_classes() != 0 &&
      d.num_classes() != static_cast<uint32_t>(d.classes_size())) {
    return DatasetFieldError("num_classes", absl::StrCat("is ", d.num_classes(),
                                                         " but classes names ", d.classes_size()));
  }
  if (d.classes().empty() && (d.num_classes() < 2 || d.num_classes() > kMaxClasses)) {
    return DatasetFieldError("num_classes",
                             absl::StrCat("required without classes: the number of classes (labels "
                                          "0..num_classes-1), 2..",
                                          kMaxClasses, ", got ", d.num_classes()));
  }
  if (!csv && !images && d.normalization() != common::v1::NORMALIZATION_UNSPECIFIED) {
    return DatasetFieldError("normalization", "used only by formats csv and image-folder");
  }
  // An image folder without normalization scales by the task's mean/std when it gives them.
  const bool mean_allowed = d.normalization() == common::v1::NORMALIZATION_STANDARDIZE ||
                            (images && d.normalization() == common::v1::NORMALIZATION_UNSPECIFIED);
  if ((csv || images) && !mean_allowed && (!d.mean().empty() || !d.std().empty())) {
    return DatasetFieldError(
        "mean", d.normalization() == common::v1::NORMALIZATION_STANDARDIZE_LOCAL
                    ? "used only with normalization standardize (standardize-local scales "
                      "with each peer's own statistics)"
                : images ? "used only with normalization standardize or without normalization"
                         : "used only with normalization standardize");
  }
  if (csv) {
    SHOAL_RETURN_IF_ERROR(CheckMeanStd(
        d, d.feature_columns().empty() ? 0 : d.feature_columns_size(), "feature column"));
  }
  if (idx && (!d.mean().empty() || !d.std().empty())) {
    return DatasetFieldError("mean", "used only by formats csv and image-folder");
  }
  if (images) {
    if (d.image_size().empty() || d.image_size_size() > 2) {
      return DatasetFieldError("image_size",
                               "required for format image-folder: [height, width] or one "
                               "value for a square");
    }
    for (uint32_t side : d.image_size()) {
      if (side < 1 || side > kMaxImageSide) {
        return DatasetFieldError(
            "image_size", absl::StrCat("each side must be in 1..", kMaxImageSide, ", got ", side));
      }
    }
    if (d.channels() != 1 && d.channels() != 3) {
      return DatasetFieldError(
          "channels", absl::StrCat("must be 1 (grayscale) or 3 (RGB), got ", d.channels()));
    }
    SHOAL_RETURN_IF_ERROR(CheckMeanStd(d, static_cast<int>(d.channels()), "channel"));
  } else {
    if (!d.image_size().empty())
      return DatasetFieldError("image_size", "used only by format image-folder");
    if (d.channels() != 0) return DatasetFieldError("channels", "used only by format image-folder");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && c == '-'))) return false;
  }
  return true;
}

bool UsesFederationStatistics(const DatasetSpec& dataset) {
  return (dataset.format() == common::v1::DATA_FORMAT_CSV ||
          dataset.format() == common::v1::DATA_FORMAT_IMAGE_FOLDER) &&
         dataset.normalization() == common::v1::NORMALIZATION_STANDARDIZE && dataset.mean().empty();
}

void ApplyDatasetDefaults(DatasetSpec& dataset) {
  if (dataset.format() == common::v1::DATA_FORMAT_UNSPECIFIED) {
    dataset.set_format(common::v1::DATA_FORMAT_FASHION_MNIST);
  }
  if (dataset.format() == common::v1::DATA_FORMAT_FASHION_MNIST && dataset.name().empty()) {
    dataset.set_name("fashion-mnist");
  }
  if (OwnFiles(dataset)) {
    if (dataset.name() == "fashion-mnist") dataset.clear_name();
    if (dataset.format() == common::v1::DATA_FORMAT_CSV &&
        dataset.normalization() == common::v1::NORMALIZATION_UNSPECIFIED) {
      dataset.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
    }
    if (dataset.test().empty() && dataset.test_fraction() == 0) {
      dataset.set_test_fraction(kDefaultTestFraction);
    }
  }
  if (dataset.partition() == common::v1::PARTITION_LABEL_SKEW && dataset.classes_per_shard() == 0) {
    dataset.set_classes_per_shard(kDefaultClassesPerShard);
  }
  if (dataset.partition() == common::v1::PARTITION_DIRICHLET && dataset.alpha() == 0) {
    dataset.set_alpha(kDefaultDirichletAlpha);
  }
}

absl::Status ValidateDatasetFields(const DatasetSpec& dataset) {
  switch (dataset.format()) {
    case common::v1::DATA_FORMAT_UNSPECIFIED:  // a spec from an API client that predates formats
    case common::v1::DATA_FORMAT_FASHION_MNIST:
      if (dataset.name() != "fashion-mnist") {
        return DatasetFieldError("name",
                                 absl::StrCat("unknown dataset ", QuoteBytes(dataset.name()),
                                              " (expected fashion-mnist, or a format: idx, "
                                              "csv, image-folder)"));
      }
      SHOAL_RETURN_IF_ERROR(NoOwnFileFields(dataset));
      break;
    case common::v1::DATA_FORMAT_IDX:
    case common::v1::DATA_FORMAT_CSV:
    case common::v1::DATA_FORMAT_IMAGE_FOLDER:
      SHOAL_RETURN_IF_ERROR(ValidateOwnFiles(dataset));
      break;
    default:
      return DatasetFieldError("format",
                               absl::StrCat("unsupported value ", JsonQuote(FormatName(dataset)),
                                            " (expected fashion-mnist, idx, csv, image-folder)"));
  }
  const uint32_t classes = OwnFiles(dataset) ? (dataset.classes().empty()
                                                    ? dataset.num_classes()
                                                    : static_cast<uint32_t>(dataset.classes_size()))
                                             : 10;
  switch (dataset.partition()) {
    case common::v1::PARTITION_IID:
      break;
    case common::v1::PARTITION_LABEL_SKEW:
      if (dataset.classes_per_shard() < 1 || dataset.classes_per_shard() > classes) {
        return DatasetFieldError("classes_per_shard",
                                 absl::StrCat("must be in 1..", classes, " for label-skew, got ",
                                              dataset.classes_per_shard()));
      }
      break;
    case common::v1::PARTITION_DIRICHLET:
      if (!(dataset.alpha() > 0) || !std::isfinite(dataset.alpha())) {
        return DatasetFieldError(
            "alpha", absl::StrCat("must be > 0 and finite for dirichlet, got ",
                                  std::isnan(dataset.alpha())   ? "nan"
                                  : std::isinf(dataset.alpha()) ? "inf"
                                                                : JsonNumber(dataset.alpha())));
      }
      break;
    default:
      return DatasetFieldError(
          "partition", absl::StrCat("unsupported value ",
                                    JsonQuote(FriendlyEnumName(*common::v1::Partition_descriptor(),
                                                               dataset.partition())),
                                    " (expected iid, label-skew, dirichlet)"));
  }
  if (dataset.partition() != common::v1::PARTITION_DIRICHLET && dataset.alpha() != 0) {
    return DatasetFieldError("alpha", "used only by partition dirichlet");
  }
  return absl::OkStatus();
}

}  // namespace shoal::task
