#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::training {

// Data shard I of N (0 <= I < N). A value type.
struct ShardSpec {
  uint32_t index = 0;
  uint32_t count = 1;

  std::string ToString() const;  // "I/N"
};

inline constexpr uint32_t kMaxShards = 100000;

// Parses "I/N". Errors: INVALID_ARGUMENT (naming `what`, e.g. "--shard") unless I and N are
// decimal integers with 0 <= I < N <= kMaxShards.
absl::StatusOr<ShardSpec> ParseShardSpec(absl::string_view text, absl::string_view what);
absl::Status ValidateShardSpec(const ShardSpec& shard);

// Deterministic Fisher-Yates shuffle driven by std::mt19937_64(seed): identical on every
// machine and process for the same seed and input.
void SeededShuffle(std::vector<int64_t>& values, uint64_t seed);

// Indices (into a dataset with `labels`) of the training samples of `shard`.
//
// PARTITION_IID: a seeded shuffle of all indices cut into N contiguous, equal (+-1) pieces;
// shard I takes piece I. Shards are disjoint and cover the data.
//
// PARTITION_LABEL_SKEW with k = classes_per_shard (1..10): there are N*k "slots"; slot s holds
// class order[s mod C] (order = a seeded permutation of the C classes), and each class's samples
// (shuffled) are split equally among the slots that hold it. Shard I takes slots I*k .. I*k+k-1,
// i.e. k distinct classes. When N*k < C some classes would have no slot; they are dealt
// round-robin onto the slots as well, so then some shards see more than k classes, but no sample
// is dropped. Shards are disjoint and cover the data.
//
// PARTITION_DIRICHLET with concentration a = alpha: for each class, shares (p_0 .. p_N-1) are
// drawn from Dirichlet(a, .., a) and the class's samples (shuffled) are cut at the cumulative
// shares; shard I takes piece I of every class. Small a gives each shard few classes and
// unequal sizes (Hsu et al. 2019). When a shard would get fewer than
// MinDirichletShardSamples(n, N) samples, the whole draw is repeated (up to 1,000 times, each
// deterministic). Shards are disjoint and cover the data. The draws use only mt19937_64 and
// the C math library, so every peer of one build computes the same split.
//
// `seed` is the split's seed (DatasetSpec.seed, else the task's). Errors: INVALID_ARGUMENT bad
// shard, unknown partition, classes_per_shard or alpha out of range, a label out of range, or a
// shard that would be empty (too small).
absl::StatusOr<std::vector<int64_t>> PartitionIndices(const std::vector<uint8_t>& labels,
                                                      int num_classes,
                                                      const common::v1::DatasetSpec& dataset,
                                                      const ShardSpec& shard, uint64_t seed);
// The same for labels of a data set with more classes than fit a byte.
absl::StatusOr<std::vector<int64_t>> PartitionIndices(const std::vector<uint32_t>& labels,
                                                      int num_classes,
                                                      const common::v1::DatasetSpec& dataset,
                                                      const ShardSpec& shard, uint64_t seed);

// The training samples of `shard`: the task's train_limit applied to `labels` (only the first N,
// the same on every peer), then PartitionIndices with PartitionSeed(spec). What the trainer
// trains on (MakeShardTensors), and what a peer's federation moments cover.
absl::StatusOr<std::vector<int64_t>> TrainShardIndices(const common::v1::TaskSpec& spec,
                                                       const ShardSpec& shard,
                                                       const std::vector<uint8_t>& labels,
                                                       int num_classes);
absl::StatusOr<std::vector<int64_t>> TrainShardIndices(const common::v1::TaskSpec& spec,
                                                       const ShardSpec& shard,
                                                       const std::vector<uint32_t>& labels,
                                                       int num_classes);

// The seed of the split of `spec`'s data: dataset.seed when set, else the task's seed.
uint64_t PartitionSeed(const common::v1::TaskSpec& spec);

// The fewest samples a Dirichlet shard may get: 10, or n / (2 N) when that is smaller (at
// least 1).
size_t MinDirichletShardSamples(size_t n, uint32_t shards);

// How many of `indices` carry each label 0 .. num_classes-1 (labels out of range are not
// counted).
std::vector<uint64_t> LabelHistogram(const std::vector<uint8_t>& labels,
                                     const std::vector<int64_t>& indices, int num_classes);
std::vector<uint64_t> LabelHistogram(const std::vector<uint32_t>& labels,
                                     const std::vector<int64_t>& indices, int num_classes);

// The evaluation slice of a test set of `count` samples: indices i with i % N == I.
std::vector<int64_t> TestSliceIndices(size_t count, const ShardSpec& shard);

}  // namespace shoal::training
