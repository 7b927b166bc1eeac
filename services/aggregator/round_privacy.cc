#include "services/aggregator/round_privacy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/privacy/dp_update.h"

namespace shoal::aggregator {

absl::Status CheckRoundDp(const OpenRoundParams& params, absl::string_view label) {
  const common::v1::DpSpec& dp = params.dp;
  if (dp.level() == common::v1::DP_LEVEL_UNSPECIFIED) return absl::OkStatus();
  auto refuse = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": differential privacy: ", what));
  };
  if (dp.level() != common::v1::DP_LEVEL_PEER) return refuse("only level peer is supported");
  if (!(dp.clip_norm() > 0) || !std::isfinite(dp.clip_norm())) {
    return refuse(absl::StrCat("clip_norm must be > 0, got ", dp.clip_norm()));
  }
  if (!(dp.noise_multiplier() >= 0) || !std::isfinite(dp.noise_multiplier())) {
    return refuse(absl::StrCat("noise_multiplier must be >= 0, got ", dp.noise_multiplier()));
  }
  if (dp.noise() != common::v1::DP_NOISE_UNSPECIFIED &&
      dp.noise() != common::v1::DP_NOISE_CENTRAL &&
      dp.noise() != common::v1::DP_NOISE_DISTRIBUTED) {
    return refuse("noise must be central (the default) or distributed");
  }
  const common::v1::Aggregation strategy = params.aggregation.strategy();
  if (strategy != common::v1::AGGREGATION_MEAN && strategy != common::v1::AGGREGATION_UNSPECIFIED) {
    return refuse("the aggregation must be mean");
  }
  if (params.aggregation.options().exact_sum()) return refuse("exact_sum is not supported");
  if (!params.late_peers.empty() || !params.standby_for.empty() || !params.backups.empty() ||
      !params.child_backups.empty()) {
    return refuse("no late peers or replicas");
  }
  if (params.dp_round_peers == 0) {
    if (!params.expected_children.empty() || !params.parent.address().empty()) {
      return refuse("a tree's round needs dp_round_peers, the peers expected in the whole round");
    }
    if (params.expected_peers.empty()) return refuse("the round expects no peer");
  } else if (params.dp_round_peers < params.expected_peers.size()) {
    return refuse(absl::StrCat("dp_round_peers ", params.dp_round_peers,
                               " is fewer than the round's own ", params.expected_peers.size(),
                               " expected peers"));
  }
  return absl::OkStatus();
}

size_t DpRoundPeers(const OpenRoundParams& params) {
  return params.dp_round_peers != 0 ? params.dp_round_peers : params.expected_peers.size();
}

absl::Status CheckDpPartial(size_t count, double total_weight, absl::string_view label) {
  if (total_weight == static_cast<double>(count)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": differential privacy weighs every update 1, but the sum of ", count,
                   " updates weighs ", total_weight));
}

void PrivatizeArrival(const common::v1::DpSpec& dp, absl::Span<float> update) {
  if (dp.noise() != common::v1::DP_NOISE_DISTRIBUTED) privacy::ClipToNorm(update, dp.clip_norm());
}

double MissingNoiseStddev(const common::v1::DpSpec& dp, size_t expected, size_t updates) {
  const double full = dp.noise_multiplier() * dp.clip_norm();
  if (dp.noise() != common::v1::DP_NOISE_DISTRIBUTED) return full;
  if (expected == 0 || updates >= expected) return 0;
  return full * std::sqrt(static_cast<double>(expected - updates) / static_cast<double>(expected));
}

absl::Status AddRoundNoise(const common::v1::DpSpec& dp, size_t expected, size_t updates,
                           size_t values, RoundAggregation& aggregation) {
  // More updates than expected cannot happen (one per expected peer); the max keeps the weight
  // non-negative regardless.
  const double weight = static_cast<double>(std::max(expected, updates) - updates);
  std::vector<float> noise;
  if (const double stddev = MissingNoiseStddev(dp, expected, updates); stddev > 0) {
    absl::StatusOr<privacy::GaussianNoise> source = privacy::GaussianNoise::FromSystemEntropy();
    if (!source.ok()) return source.status();
    noise.assign(values, 0.0F);
    source->Add(absl::MakeSpan(noise), stddev);
  }
  return aggregation.AddNoiseTerm(noise, weight);
}

absl::StatusOr<std::vector<float>> PrivateMeanOfSum(const common::v1::DpSpec& dp,
                                                    absl::Span<const double> sum, size_t updates,
                                                    size_t expected, absl::Span<const float> base) {
  if (sum.size() != base.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the secure sum has ", sum.size(), " values, the model ", base.size()));
  }
  std::vector<float> noise(sum.size(), 0.0F);
  if (const double stddev = MissingNoiseStddev(dp, expected, updates); stddev > 0) {
    absl::StatusOr<privacy::GaussianNoise> source = privacy::GaussianNoise::FromSystemEntropy();
    if (!source.ok()) return source.status();
    source->Add(absl::MakeSpan(noise), stddev);
  }
  const double divisor = static_cast<double>(std::max<size_t>(expected, 1));
  std::vector<float> out(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    out[i] = static_cast<float>(base[i] + (sum[i] + noise[i]) / divisor);
  }
  return out;
}

}  // namespace shoal::aggregator
