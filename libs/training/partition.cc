#include "libs/training/partition.h"

#include <algorithm>
#include <cmath>
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

namespace {

constexpr int kDirichletAttempts = 1000;

// A double in (0, 1) from 53 random bits: the same on every platform, unlike
// std::uniform_real_distribution.
double Uniform01(std::mt19937_64& gen) {
  return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal, Box-Muller.
double Normal(std::mt19937_64& gen) {
  const double u1 = Uniform01(gen);
  const double u2 = Uniform01(gen);
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Gamma(a, 1) by Marsaglia and Tsang (2000); for a < 1, Gamma(a + 1) * U^(1/a).
double Gamma(double a, std::mt19937_64& gen) {
  if (a < 1) return Gamma(a + 1, gen) * std::pow(Uniform01(gen), 1 / a);
  const double d = a - 1.0 / 3;
  const double c = 1 / std::sqrt(9 * d);
  for (;;) {
    const double x = Normal(gen);
    double v = 1 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = Uniform01(gen);
    if (u < 1 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v))) return d * v;
  }
}

// The seed of class c's shuffle, derived from the split's seed.
uint64_t ClassSeed(uint64_t seed, int c) {
  return seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(c + 1));
}

template <typename Label>
absl::StatusOr<std::vector<std::vector<int64_t>>> ByClass(const std::vector<Label>& labels,
                                                          int num_classes) {
  std::vector<std::vector<int64_t>> by_class(num_classes);
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= static_cast<uint64_t>(num_classes)) {
      return absl::InvalidArgumentError(absl::StrCat("label ", static_cast<uint64_t>(labels[i]),
                                                     " of sample ", i, " is out of range"));
    }
    by_class[labels[i]].push_back(static_cast<int64_t>(i));
  }
  return by_class;
}

// Where each class is cut: cuts[c][I] .. cuts[c][I + 1] of class c's shuffled samples go to
// shard I. The first draw whose every shard gets at least `min_size` samples.
absl::StatusOr<std::vector<std::vector<size_t>>> DirichletCuts(
    const std::vector<std::vector<int64_t>>& by_class, uint32_t shards, double alpha,
    size_t min_size, uint64_t seed) {
  std::mt19937_64 gen(seed ^ 0xd1b54a32d192ed03ULL);
  std::vector<std::vector<size_t>> cuts(by_class.size());
  std::vector<double> shares(shards);
  for (int attempt = 0; attempt < kDirichletAttempts; ++attempt) {
    std::vector<size_t> sizes(shards, 0);
    for (size_t c = 0; c < by_class.size(); ++c) {
      double sum = 0;
      do {  // an all-zero draw (tiny alpha underflowing) is drawn again
        sum = 0;
        for (double& share : shares) sum += (share = Gamma(alpha, gen));
      } while (!(sum > 0));
      const size_t m = by_class[c].size();
      std::vector<size_t>& cut = cuts[c];
      cut.assign(shards + 1, 0);
      double cumulative = 0;
      for (uint32_t i = 0; i < shards; ++i) {
        cumulative += shares[i];
        cut[i + 1] = i + 1 == shards ? m
                                     : std::min(m, static_cast<size_t>(std::floor(
                                                       cumulative / sum * static_cast<double>(m))));
        cut[i + 1] = std::max(cut[i + 1], cut[i]);
        sizes[i] += cut[i + 1] - cut[i];
      }
    }
    if (*std::min_element(sizes.begin(), sizes.end()) >= min_size) return cuts;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.alpha ", alpha, ": no Dirichlet split of ", kDirichletAttempts,
                   " tried gives each of ", shards, " shards at least ", min_size,
                   " samples; raise alpha or use fewer shards"));
}

template <typename Label>
std::vector<uint64_t> HistogramImpl(const std::vector<Label>& labels,
                                    const std::vector<int64_t>& indices, int num_classes) {
  std::vector<uint64_t> histogram(num_classes, 0);
  for (int64_t i : indices) {
    if (i >= 0 && static_cast<size_t>(i) < labels.size() &&
        labels[i] < static_cast<uint64_t>(num_classes)) {
      ++histogram[labels[i]];
    }
  }
  return histogram;
}

template <typename Label>
absl::StatusOr<std::vector<int64_t>> PartitionImpl(const std::vector<Label>& labels,
                                                   int num_classes,
                                                   const common::v1::DatasetSpec& dataset,
                                                   const ShardSpec& shard, uint64_t seed) {
  if (absl::Status s = ValidateShardSpec(shard); !s.ok()) return s;
  const size_t n = labels.size();
  std::vector<int64_t> out;
  const uint32_t classes_per_shard = dataset.classes_per_shard();
  switch (dataset.partition()) {
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
      absl::StatusOr<std::vector<std::vector<int64_t>>> by_class =
          ByClass<Label>(labels, num_classes);
      if (!by_class.ok()) return by_class.status();
      const uint64_t first_slot = uint64_t{shard.index} * k;
      const uint64_t last_slot = first_slot + k;  // exclusive
      for (int c = 0; c < num_classes; ++c) {
        std::vector<int64_t>& samples = (*by_class)[c];
        SeededShuffle(samples, ClassSeed(seed, c));
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
    case common::v1::PARTITION_DIRICHLET: {
      const double alpha = dataset.alpha();
      if (!(alpha > 0) || !std::isfinite(alpha)) {
        return absl::InvalidArgumentError(
            absl::StrCat("dataset.alpha must be > 0 and finite, got ", alpha));
      }
      absl::StatusOr<std::vector<std::vector<int64_t>>> by_class =
          ByClass<Label>(labels, num_classes);
      if (!by_class.ok()) return by_class.status();
      absl::StatusOr<std::vector<std::vector<size_t>>> cuts = DirichletCuts(
          *by_class, shard.count, alpha, MinDirichletShardSamples(n, shard.count), seed);
      if (!cuts.ok()) return cuts.status();
      for (int c = 0; c < num_classes; ++c) {
        std::vector<int64_t>& samples = (*by_class)[c];
        SeededShuffle(samples, ClassSeed(seed, c));
        const std::vector<size_t>& cut = (*cuts)[c];
        out.insert(out.end(), samples.begin() + static_cast<std::ptrdiff_t>(cut[shard.index]),
                   samples.begin() + static_cast<std::ptrdiff_t>(cut[shard.index + 1]));
      }
      std::sort(out.begin(), out.end());
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("dataset.partition: unknown partition ",
                                                     static_cast<int>(dataset.partition())));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard.ToString(), " of ", n, " training samples would be empty"));
  }
  return out;
}

template <typename Label>
absl::StatusOr<std::vector<int64_t>> TrainShardImpl(const common::v1::TaskSpec& spec,
                                                    const ShardSpec& shard,
                                                    const std::vector<Label>& labels,
                                                    int num_classes) {
  const uint32_t limit = spec.dataset().train_limit();
  if (limit == 0 || limit >= labels.size()) {
    return PartitionImpl(labels, num_classes, spec.dataset(), shard, PartitionSeed(spec));
  }
  const std::vector<Label> first(labels.begin(), labels.begin() + limit);
  return PartitionImpl(first, num_classes, spec.dataset(), shard, PartitionSeed(spec));
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> TrainShardIndices(const common::v1::TaskSpec& spec,
                                                       const ShardSpec& shard,
                                                       const std::vector<uint8_t>& labels,
                                                       int num_classes) {
  return TrainShardImpl(spec, shard, labels, num_classes);
}

absl::StatusOr<std::vector<int64_t>> TrainShardIndices(const common::v1::TaskSpec& spec,
                                                       const ShardSpec& shard,
                                                       const std::vector<uint32_t>& labels,
                                                       int num_classes) {
  return TrainShardImpl(spec, shard, labels, num_classes);
}

size_t MinDirichletShardSamples(size_t n, uint32_t shards) {
  const size_t half_share = shards == 0 ? n : n / (2 * size_t{shards});
  return std::max<size_t>(1, std::min<size_t>(10, half_share));
}

uint64_t PartitionSeed(const common::v1::TaskSpec& spec) {
  return spec.dataset().has_seed() ? spec.dataset().seed() : spec.seed();
}

std::vector<uint64_t> LabelHistogram(const std::vector<uint8_t>& labels,
                                     const std::vector<int64_t>& indices, int num_classes) {
  return HistogramImpl(labels, indices, num_classes);
}

std::vector<uint64_t> LabelHistogram(const std::vector<uint32_t>& labels,
                                     const std::vector<int64_t>& indices, int num_classes) {
  return HistogramImpl(labels, indices, num_classes);
}

absl::StatusOr<std::vector<int64_t>> PartitionIndices(const std::vector<uint8_t>& labels,
                                                      int num_classes,
                                                      const common::v1::DatasetSpec& dataset,
                                                      const ShardSpec& shard, uint64_t seed) {
  return PartitionImpl(labels, num_classes, dataset, shard, seed);
}

absl::StatusOr<std::vector<int64_t>> PartitionIndices(const std::vector<uint32_t>& labels,
                                                      int num_classes,
                                                      const common::v1::DatasetSpec& dataset,
                                                      const ShardSpec& shard, uint64_t seed) {
  return PartitionImpl(labels, num_classes, dataset, shard, seed);
}

std::vector<int64_t> TestSliceIndices(size_t count, const ShardSpec& shard) {
  std::vector<int64_t> out;
  if (shard.count == 0) return out;
  out.reserve(count / shard.count + 1);
  for (size_t i = shard.index; i < count; i += shard.count) out.push_back(static_cast<int64_t>(i));
  return out;
}

}  // namespace shoal::training
