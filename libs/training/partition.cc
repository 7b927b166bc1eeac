#include "libs/training/partition.h"

#include <algorithm>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal::training {

std::string ShardSpec::ToString() const { return absl::StrCat(index, "/", count); }

absl::Status ValidateShardSpec(const ShardSpec& shard) {
  if (shard.count == 0 || shard.count > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard count must be in [1, ", kMaxShards, "], got ", shard.ToString()));
  }
  if (shard.index >= shard.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard index must be less than the shard count (shards are numbered from 0), got ",
        shard.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardSpec> ParseShardSpec(absl::string_view text, absl::string_view what) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '/');
  ShardSpec shard;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &shard.index) ||
      !absl::SimpleAtoi(parts[1], &shard.count) || parts[0].empty() || parts[0][0] == '+' ||
      parts[1][0] == '+') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected I/N (shard I of N, 0 <= I < N), got \"", text, "\""));
  }
  absl::Status status = ValidateShardSpec(shard);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", status.message()));
  }
  return shard;
}

void SeededShuffle(std::vector<int64_t>& values, uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (size_t i = values.size(); i > 1; --i) {
    // Unbiased enough for shuffling data (modulo bias is < 2^-40 for our sizes).
    size_t j = static_cast<size_t>(gen() % i);
    std::swap(values[i - 1], values[j]);
  }
}

absl::StatusOr<std::vector<int64_t>> PartitionIndices(const std::vector<uint8_t>& labels,
                                                      int num_classes,
                                                      common::v1::Partition partition,
                                                      uint32_t classes_per_shard,
                                                      const ShardSpec& shard, uint64_t seed) {
  if (absl::Status s = ValidateShardSpec(shard); !s.ok()) return s;
  const size_t n = labels.size();
  std::vector<int64_t> out;
  switch (partition) {
    case common::v1::PARTITION_UNSPECIFIED:
    case common::v1::PARTITION_IID: {
      std::vector<int64_t> all(n);
      for (size_t i = 0; i < n; ++i) all[i] = static_cast<int64_t>(i);
      SeededShuffle(all, seed);
      const size_t begin = n * shard.index / shard.count;
      const size_t end = n * (shard.index + 1) / shard.count;
      out.assign(all.begin() + begin, all.begin() + end);
      break;
    }
    case common::v1::PARTITION_LABEL_SKEW: {
      const uint32_t k = classes_per_shard;
      if (k < 1 || k > static_cast<uint32_t>(num_classes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("dataset.classes_per_shard must be in [1, ", num_classes, "], got ", k));
      }
      std::vector<int64_t> order(num_classes);
      for (int c = 0; c < num_classes; ++c) order[c] = c;
      SeededShuffle(order, seed);
      const uint64_t slots = uint64_t{shard.count} * k;
      // holders[c] = the slots holding class c, in increasing order.
      std::vector<std::vector<uint64_t>> holders(num_classes);
      for (uint64_t s = 0; s < slots; ++s) holders[order[s % num_classes]].push_back(s);
      for (int pos = 0; pos < num_classes; ++pos) {
        if (holders[order[pos]].empty()) holders[order[pos]].push_back(pos % slots);
      }
      std::vector<std::vector<int64_t>> by_class(num_classes);
      for (size_t i = 0; i < n; ++i) {
        if (labels[i] >= num_classes) {
          return absl::InvalidArgumentError(
              absl::StrCat("label ", int{labels[i]}, " of sample ", i, " is out of range"));
        }
        by_class[labels[i]].push_back(static_cast<int64_t>(i));
      }
      const uint64_t first_slot = uint64_t{shard.index} * k;
      const uint64_t last_slot = first_slot + k;  // exclusive
      for (int c = 0; c < num_classes; ++c) {
        std::vector<int64_t>& samples = by_class[c];
        SeededShuffle(samples, seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(c + 1)));
        const std::vector<uint64_t>& h = holders[c];
        for (size_t j = 0; j < h.size(); ++j) {
          if (h[j] < first_slot || h[j] >= last_slot) continue;
          const size_t begin = samples.size() * j / h.size();
          const size_t end = samples.size() * (j + 1) / h.size();
          out.insert(out.end(), samples.begin() + begin, samples.begin() + end);
        }
      }
      std::sort(out.begin(), out.end());
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.partition: unknown partition ", static_cast<int>(partition)));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard.ToString(), " of ", n, " training samples would be empty"));
  }
  return out;
}

std::vector<int64_t> TestSliceIndices(size_t count, const ShardSpec& shard) {
  std::vector<int64_t> out;
  if (shard.count == 0) return out;
  out.reserve(count / shard.count + 1);
  for (size_t i = shard.index; i < count; i += shard.count) out.push_back(static_cast<int64_t>(i));
  return out;
}

}  // namespace shoal::training
