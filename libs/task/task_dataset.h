#pragma once

// The dataset section of a task: Fashion-MNIST, or files of each peer's own (idx, csv,
// image-folder) with their columns, classes, image size and normalisation.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::task {

// A task's or a data set's name: [a-z0-9][a-z0-9-]{0,62} (kNamePattern, for messages).
inline constexpr char kNamePattern[] = "[a-z0-9][a-z0-9-]{0,62}";
bool IsValidName(absl::string_view name);

// Checks every dataset rule of protos/shoal/common/v1/task.proto. INVALID_ARGUMENT
// "dataset.<field>: <what>". Part of ValidateTaskSpec.
absl::Status ValidateDatasetFields(const common::v1::DatasetSpec& dataset);

// Whether the peers standardise `dataset` with the federation's statistics: format csv or
// image-folder, normalization standardize and no mean/std of the task's (TaskStatus.statistics).
// An image folder without normalization is not standardised (pixels in [0, 1]) unless the task
// gives mean/std: there the federation's statistics are opt-in.
bool UsesFederationStatistics(const common::v1::DatasetSpec& dataset);

// The dataset defaults that depend on other fields: format fashion-mnist when unset (and its
// name), partition settings (classes_per_shard 2 for label-skew, alpha 0.5 for dirichlet),
// normalization standardize for csv (image-folder's stays unset: the task's mean/std, or pixels
// in [0, 1] only), test_fraction 0.2 without a test file. A default
// "fashion-mnist" name is cleared for the other formats.
void ApplyDatasetDefaults(common::v1::DatasetSpec& dataset);

}  // namespace shoal::task
