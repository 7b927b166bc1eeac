#include "libs/task/task_privacy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/privacy/rdp_accountant.h"
#include "libs/task/field_error.h"
#include "libs/task/task_dataset.h"
#include "libs/task/task_file.h"
#include "libs/task/task_mode.h"

namespace shoal::task {
namespace {

using common::v1::TaskSpec;

// A combination DP does not support yet: names the other field and why.
absl::Status Conflict(absl::string_view field, absl::string_view what) {
  return FieldError(field, absl::StrCat(what, " (privacy.dp is set)"));
}

// A setting secure aggregation does not go with: names the other field and why.
absl::Status SecureConflict(absl::string_view field, absl::string_view what) {
  return FieldError(field, absl::StrCat(what, " (privacy.secure_aggregation is set)"));
}

}  // namespace

double StatisticsFeatureBound(const TaskSpec& spec) {
  const double bound = spec.privacy().secure_aggregation().feature_bound();
  if (bound > 0) return bound;
  return spec.dataset().format() == common::v1::DATA_FORMAT_IMAGE_FOLDER ? 1.0 : 0.0;
}

namespace {

absl::Status ValidateSecureAggregation(const TaskSpec& spec) {
  if (!HasSecureAggregation(spec)) return absl::OkStatus();
  const common::v1::SecureAggregationSpec& sa = spec.privacy().secure_aggregation();
  if (const ModeDefinition& mode = ModeDefinitionOrDefault(spec.mode());
      !mode.sections.secure_aggregation) {
    const char* why =
        spec.mode() == common::v1::MODE_FEDERATED_ASYNC
            ? "its buffer aggregates each update as it arrives, and secure aggregation needs a "
              "round's peers to mask their updates together"
            : "gossip exchanges whole models between two peers at a time and cannot take masks "
              "(they cancel only in the sum of a round's updates)";
    return FieldError(
        "privacy.secure_aggregation",
        absl::StrCat(
            "supported in ",
            ModeNames([](const ModeDefinition& m) { return m.sections.secure_aggregation; },
                      " or "),
            " tasks only; not in mode ", mode.name, ": ", why));
  }
  if (HasPeerDp(spec) && sa.clip_norm() != 0 && sa.clip_norm() != spec.privacy().dp().clip_norm()) {
    return FieldError("privacy.secure_aggregation.clip_norm",
                      absl::StrCat("must equal privacy.dp.clip_norm (",
                                   ShowNumber(spec.privacy().dp().clip_norm()),
                                   "), or be left out, with privacy.dp at level peer: updates are "
                                   "clipped once, got ",
                                   ShowNumber(sa.clip_norm())));
  }
  if (const double clip = SecureClipNorm(spec); !(clip > 0) || !std::isfinite(clip)) {
    return FieldError("privacy.secure_aggregation.clip_norm",
                      absl::StrCat("must be > 0, got ", ShowNumber(sa.clip_norm())));
  }
  if (!(sa.feature_bound() >= 0) || !(sa.feature_bound() <= 1e30)) {
    return FieldError(
        "privacy.secure_aggregation.feature_bound",
        absl::StrCat("must be > 0 and at most 1e30, got ", ShowNumber(sa.feature_bound())));
  }
  if (UsesFederationStatistics(spec.dataset()) && StatisticsFeatureBound(spec) == 0) {
    return FieldError("privacy.secure_aggregation.feature_bound",
                      "required with normalization standardize and no dataset mean/std: the "
                      "largest |value| of any feature, which sizes the fixed-point encoding of the "
                      "peers' masked moments for the federation's statistics");
  }
  if (sa.threshold() == 1) {
    return FieldError("privacy.secure_aggregation.threshold", "must be 0 (the default) or >= 2");
  }
  if (spec.mode() == common::v1::MODE_DECENTRALIZED) {
    // Every participant masks with every other one and reveals its own seeds: no Shamir shares.
    if (sa.threshold() != 0) {
      return FieldError("privacy.secure_aggregation.threshold",
                        "must be 0 in a decentralized task (its participants mask with every other "
                        "one and reveal their own seeds; there are no Shamir shares)");
    }
    if (sa.neighbourhood_size() != 0) {
      return FieldError("privacy.secure_aggregation.neighbourhood_size",
                        "must be 0 in a decentralized task (every participant masks with every "
                        "other one)");
    }
  }
  if (sa.neighbourhood_size() == 1) {
    return FieldError("privacy.secure_aggregation.neighbourhood_size",
                      "must be 0 (every other peer) or >= 2");
  }
  if (spec.min_participants() < 3) {
    return SecureConflict("min_participants",
                          absl::StrCat("must be at least 3 (secure aggregation masks each update "
                                       "among at least 3 peers), got ",
                                       spec.min_participants()));
  }
  if (spec.topology() == common::v1::TOPOLOGY_HIERARCHICAL) {
    // Each cluster is one secure round; the aggregators above add up the clusters' sums. With
    // replicas, a backup that takes over a cluster starts its secure round again.
    if (spec.has_cluster_size() && spec.cluster_size() < 3) {
      return SecureConflict("cluster_size",
                            absl::StrCat("must be at least 3 on a tree (each cluster masks among "
                                         "its own peers), got ",
                                         spec.cluster_size()));
    }
    if (sa.threshold() != 0) {
      return SecureConflict("privacy.secure_aggregation.threshold",
                            "must be 0 on a tree: each cluster's round picks its own from the "
                            "peers it has");
    }
    if (spec.aggregation_options().exact_sum()) {
      return SecureConflict("aggregation_options.exact_sum",
                            "not supported on a tree (the clusters' sums travel in float32)");
    }
  }
  if (sa.threshold() != 0) {
    // The smallest round has min_participants peers; its neighbourhoods hold fewer.
    const uint32_t smallest =
        std::min<uint32_t>(spec.min_participants() - 1,
                           sa.neighbourhood_size() == 0 ? UINT32_MAX : sa.neighbourhood_size());
    if (sa.threshold() > smallest) {
      return FieldError("privacy.secure_aggregation.threshold",
                        absl::StrCat(sa.threshold(), " exceeds the ", smallest,
                                     " neighbours of a peer in a round of min_participants ",
                                     spec.min_participants()));
    }
    // More than half of the largest neighbourhood (an odd k's Harary graph has k + 1 when the
    // round's peers are odd too).
    uint64_t largest = UINT32_MAX;
    if (sa.neighbourhood_size() != 0) {
      largest = sa.neighbourhood_size() + uint64_t{sa.neighbourhood_size() % 2};
    }
    if (spec.max_participants() != 0) {
      largest = std::min<uint64_t>(largest, spec.max_participants() - 1);
    }
    if (2 * uint64_t{sa.threshold()} <= largest) {
      return FieldError(
          "privacy.secure_aggregation.threshold",
          absl::StrCat(sa.threshold(),
                       " must be more than half of the largest neighbourhood (up to ", largest,
                       " neighbours): lower neighbourhood_size or max_participants, or leave the "
                       "threshold at 0"));
    }
  }
  if (spec.aggregation() != common::v1::AGGREGATION_MEAN &&
      spec.aggregation() != common::v1::AGGREGATION_UNSPECIFIED) {
    return SecureConflict(
        "aggregation",
        absl::StrCat(FriendlyEnumName(*common::v1::Aggregation_descriptor(), spec.aggregation()),
                     " must see each update, and secure aggregation reveals only their sum "
                     "(use aggregation: mean)"));
  }
  if (spec.straggler_factor() != 0) {
    return SecureConflict("straggler_factor",
                          "not supported with secure aggregation (a late update is not masked "
                          "with its round's peers)");
  }
  if (spec.compression() != common::v1::COMPRESSION_UNSPECIFIED &&
      spec.compression() != common::v1::COMPRESSION_NONE) {
    return SecureConflict("compression",
                          "a masked update is uniformly random and cannot be compressed");
  }
  if (spec.max_update_norm() != 0) {
    return SecureConflict("max_update_norm",
                          "nobody can check a masked update's norm; each peer clips its own to "
                          "privacy.secure_aggregation.clip_norm");
  }
  return absl::OkStatus();
}

}  // namespace

double SecureClipNorm(const TaskSpec& spec) {
  const double clip = spec.privacy().secure_aggregation().clip_norm();
  return clip == 0 && HasPeerDp(spec) ? spec.privacy().dp().clip_norm() : clip;
}

void ApplyPrivacyDefaults(TaskSpec& spec) {
  if (!HasPeerDp(spec)) return;
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  if (dp.noise() == common::v1::DP_NOISE_UNSPECIFIED) {
    dp.set_noise(HasSecureAggregation(spec) ? common::v1::DP_NOISE_DISTRIBUTED
                                            : common::v1::DP_NOISE_CENTRAL);
  }
}

absl::Status ValidatePrivacy(const TaskSpec& spec) {
  if (absl::Status s = ValidateSecureAggregation(spec); !s.ok()) return s;
  if (!HasDp(spec)) return absl::OkStatus();
  const common::v1::DpSpec& dp = spec.privacy().dp();
  switch (dp.level()) {
    case common::v1::DP_LEVEL_PEER:
    case common::v1::DP_LEVEL_SAMPLE:
      break;
    case common::v1::DP_LEVEL_UNSPECIFIED:
      return FieldError("privacy.dp.level", "required (peer or sample)");
    default:
      return FieldError(
          "privacy.dp.level",
          absl::StrCat("unsupported value ",
                       JsonQuote(FriendlyEnumName(*common::v1::DpLevel_descriptor(), dp.level())),
                       " (expected peer, sample)"));
  }
  const ModeDefinition& mode = ModeDefinitionOrDefault(spec.mode());
  if (!mode.sections.dp_sample && !mode.sections.dp_peer) {
    return FieldError("privacy.dp",
                      absl::StrCat("differential privacy is supported in ",
                                   ModeNames(
                                       [](const ModeDefinition& m) {
                                         return m.sections.dp_sample || m.sections.dp_peer;
                                       },
                                       " or "),
                                   " tasks only; not supported yet in mode ", mode.name));
  }
  if (dp.level() == common::v1::DP_LEVEL_PEER && !mode.sections.dp_peer) {
    return FieldError("privacy.dp.level", absl::StrCat("peer is not supported in ", mode.name,
                                                       " tasks: ", mode.sections.dp_peer_refusal));
  }
  if (dp.level() == common::v1::DP_LEVEL_SAMPLE && !mode.sections.dp_sample) {
    return FieldError("privacy.dp.level",
                      absl::StrCat("sample is not supported in ", mode.name, " tasks"));
  }
  if (dp.level() == common::v1::DP_LEVEL_PEER && mode.sections.dp_noise_at_peers &&
      dp.noise() == common::v1::DP_NOISE_DISTRIBUTED && !HasSecureAggregation(spec)) {
    return FieldError("privacy.dp.noise",
                      absl::StrCat("distributed needs privacy.secure_aggregation in ", mode.name,
                                   " tasks: every participant sees each update in the clear, so "
                                   "each must carry the full noise (use noise: central)"));
  }
  if (!(dp.clip_norm() > 0) || !std::isfinite(dp.clip_norm())) {
    return FieldError("privacy.dp.clip_norm",
                      absl::StrCat("must be > 0, got ", ShowNumber(dp.clip_norm())));
  }
  if (!(dp.noise_multiplier() >= 0) || !std::isfinite(dp.noise_multiplier())) {
    return FieldError("privacy.dp.noise_multiplier",
                      absl::StrCat("must be >= 0, got ", ShowNumber(dp.noise_multiplier())));
  }
  if (dp.level() == common::v1::DP_LEVEL_SAMPLE && dp.noise() != common::v1::DP_NOISE_UNSPECIFIED) {
    return FieldError("privacy.dp.noise",
                      "applies to level peer only: at level sample each peer's DP-SGD step adds "
                      "the noise (remove it)");
  }
  // Unspecified is the default, central (a spec that arrives without a file has no defaults).
  if (dp.noise() != common::v1::DP_NOISE_UNSPECIFIED &&
      dp.noise() != common::v1::DP_NOISE_CENTRAL &&
      dp.noise() != common::v1::DP_NOISE_DISTRIBUTED) {
    return FieldError(
        "privacy.dp.noise",
        absl::StrCat("unsupported value ",
                     JsonQuote(FriendlyEnumName(*common::v1::DpNoise_descriptor(), dp.noise())),
                     " (expected central, distributed)"));
  }
  if (!(dp.delta() > 0 && dp.delta() < 1)) {
    return FieldError("privacy.dp.delta",
                      absl::StrCat("must be in (0, 1), e.g. 1e-5, got ", ShowNumber(dp.delta())));
  }
  if (dp.has_target_epsilon() &&
      (!(dp.target_epsilon() > 0) || !std::isfinite(dp.target_epsilon()))) {
    return FieldError("privacy.dp.target_epsilon",
                      absl::StrCat("must be > 0, got ", ShowNumber(dp.target_epsilon())));
  }
  if (dp.has_target_epsilon() && !mode.sections.dp_target_epsilon) {
    return FieldError("privacy.dp.target_epsilon",
                      absl::StrCat("not supported in ", mode.name,
                                   " tasks: each peer trains its rounds x round_batches steps "
                                   "and nothing stops it at a budget; the task status shows the "
                                   "epsilon spent (choose rounds so that it fits)"));
  }
  if (spec.straggler_factor() != 0) {
    return Conflict("straggler_factor",
                    "not supported yet with differential privacy (a late update weighted by "
                    "staleness breaks the fixed-denominator mean the noise is calibrated to, and "
                    "its training would go uncharged)");
  }
  // Level sample: the budget depends on the peers' shard sizes, known once they report them;
  // the task completes before a round that would pass the target (FederatedSyncTask).
  // On a tree each peer's DP-SGD step made its update private: the tree only adds.
  if (dp.level() == common::v1::DP_LEVEL_SAMPLE) return absl::OkStatus();
  if (spec.topology() == common::v1::TOPOLOGY_HIERARCHICAL && spec.replicas() > 1) {
    // The clusters send their sums of clipped updates, and the root alone adds the noise.
    return Conflict("replicas",
                    "not supported yet with privacy.dp at level peer on a tree (a backup that "
                    "takes over a cluster's or the root's round would have to add the noise "
                    "exactly once, and nothing ensures that yet); remove it or set 1");
  }
  if (dp.has_target_epsilon()) {
    // The budget must hold at least one round in which every peer takes part (q = 1: every
    // peer of a federated-sync task is expected in every round).
    absl::StatusOr<privacy::RdpAccountant> accountant = privacy::RdpAccountant::Create();
    if (!accountant.ok()) return accountant.status();
    absl::StatusOr<int64_t> left =
        accountant->StepsLeft(1.0, dp.noise_multiplier(), dp.target_epsilon(), dp.delta());
    if (!left.ok()) return FieldError("privacy.dp", left.status().message());
    if (*left < 1) {
      privacy::RdpAccountant one = *accountant;
      std::string spent = "infinite";
      if (one.AddSteps(1.0, dp.noise_multiplier(), 1).ok()) {
        if (auto e = one.Spent(dp.delta()); e.ok()) spent = ShowNumber(e->epsilon);
      }
      return FieldError(
          "privacy.dp.target_epsilon",
          absl::StrCat("one round at noise_multiplier ", ShowNumber(dp.noise_multiplier()),
                       " already spends epsilon ", spent, " at delta ", ShowNumber(dp.delta()),
                       ", over ", ShowNumber(dp.target_epsilon()),
                       " (raise target_epsilon or noise_multiplier)"));
    }
  }
  if (spec.aggregation() != common::v1::AGGREGATION_MEAN &&
      spec.aggregation() != common::v1::AGGREGATION_UNSPECIFIED) {
    return Conflict(
        "aggregation",
        absl::StrCat(FriendlyEnumName(*common::v1::Aggregation_descriptor(), spec.aggregation()),
                     " is not supported with differential privacy: the noise is calibrated to "
                     "the sum of clipped updates, the sensitivity of a mean and of no robust "
                     "strategy (use aggregation: mean)"));
  }
  if (spec.aggregation_options().exact_sum()) {
    return Conflict("aggregation_options.exact_sum",
                    "not supported yet with differential privacy (the noisy sum is float32)");
  }
  if (spec.compression() == common::v1::COMPRESSION_TOPK) {
    return Conflict("compression",
                    "topk is not supported yet with differential privacy (its error feedback "
                    "sends values later that the clipped update left out)");
  }
  return absl::OkStatus();
}

}  // namespace shoal::task
