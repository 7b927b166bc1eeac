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
// Errors: INVALID_ARGUMENT bad shard, unknown partition, classes_per_shard out of range, or a
// shard that would be empty.
absl::StatusOr<std::vector<int64_t>> PartitionIndices(const std::vector<uint8_t>& labels,
                                                      int num_classes,
                                                      common::v1::Partition partition,
                                                      uint32_t classes_per_shard,
                                                      const ShardSpec& shard, uint64_t seed);

// The evaluation slice of a test set of `count` samples: indices i with i % N == I.
std::vector<int64_t> TestSliceIndices(size_t count, const ShardSpec& shard);

}  // namespace shoal::training
