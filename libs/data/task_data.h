#pragma once

// A task's data set from a peer's own files: the DatasetSpec of formats idx, csv and
// image-folder turned into loader options, the files read from the peer's data directory,
// features standardised (or left for the federation's statistics), and a test set held out when
// the task names none. Torch-free.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/data/dataset.h"
#include "libs/data/feature_moments.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::data {

struct TaskData {
  Dataset train;
  Dataset test;
  bool test_held_out = false;  // `test` is test_fraction of the training file(s)
  // normalization standardize without the task's mean/std: the features are as loaded (an
  // image's pixels scaled to [0, 1]), to be standardised with the federation's statistics
  // (StandardizeTaskData).
  bool awaits_statistics = false;
  std::string summary;  // for the peer's log: files, samples, features or image size
};

// Whether `dataset` names files of the peer's own (formats idx, csv, image-folder) rather than
// the built-in Fashion-MNIST.
bool UsesOwnFiles(const common::v1::DatasetSpec& dataset);

// The number of classes of `dataset`: classes.size() when it names them, else num_classes;
// 10 for fashion-mnist.
int TaskClassCount(const common::v1::DatasetSpec& dataset);

// Reads the files `dataset` names, relative paths from `data_dir`. `seed` shuffles the held-out
// split when there is no test file. Both sets have TaskClassCount() classes and one sample
// shape. Errors name the file (and line or image) and what is wrong: NOT_FOUND a missing file,
// INVALID_ARGUMENT bad content or a spec that does not fit the files (a column or class that is
// absent, a test file whose features differ from the training file's).
absl::StatusOr<TaskData> LoadTaskData(const common::v1::DatasetSpec& dataset,
                                      const std::string& data_dir, uint64_t seed);

// Standardises both splits of `data`, which awaits_statistics, with the federation's
// statistics (one mean and stddev per feature: a table's column, an image's channel); clears
// awaits_statistics. INVALID_ARGUMENT (data unchanged) when their sizes do not match the
// features or a value would leave float's range; FAILED_PRECONDITION when `data` does not await
// statistics.
absl::Status StandardizeTaskData(const FeatureStatistics& statistics, TaskData& data);

// Splits off the last ceil(fraction x count) samples of a seeded shuffle of `data` as the test
// set (at least one sample on each side). INVALID_ARGUMENT for fewer than 2 samples.
absl::Status HoldOut(Dataset& data, double fraction, uint64_t seed, Dataset& test);

}  // namespace shoal::data
