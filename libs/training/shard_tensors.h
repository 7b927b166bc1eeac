#pragma once

// A peer's share of a data set as tensors: the limits and partition of the task applied to the
// full training set (shard I of N, the same computation on every peer), the test slice, and the
// samples converted to normalised float tensors. Exposes LibTorch: for libs/training only.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/dataset.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"

namespace shoal::training {

struct ShardTensors {
  torch::Tensor train_x, train_y;  // float [n, sample shape...], int64 [n] (on the CPU)
  torch::Tensor test_x, test_y;
  int num_classes = 0;
  std::vector<uint64_t> label_histogram;  // training samples per class
};

// Fashion-MNIST (or any uint8 IDX images): pixels scaled to [0, 1] and normalised with
// Fashion-MNIST's mean and standard deviation, shape [n, 1, rows, cols].
absl::StatusOr<ShardTensors> MakeShardTensors(const TrainerOptions& options,
                                              const RawDataset& train, const RawDataset& test);
// A data set of the peer's own files, values as loaded (already scaled), labels as given.
absl::StatusOr<ShardTensors> MakeShardTensors(const TrainerOptions& options,
                                              const data::Dataset& train,
                                              const data::Dataset& test);

}  // namespace shoal::training
