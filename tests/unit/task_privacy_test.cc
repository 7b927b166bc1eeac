// The privacy section of task files (libs/task/task_privacy.h): parsing, defaults, and each
// refusal naming its field.

#include "libs/task/task_privacy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "libs/task/task_file.h"

namespace shoal::task {
namespace {

using ::testing::HasSubstr;

constexpr char kBase[] = R"(name: dp
model: mlp
rounds: 5
)";

absl::StatusOr<common::v1::TaskSpec> Parse(const std::string& extra) {
  return ParseTaskSpec(absl::StrCat(kBase, extra), "dp.yaml");
}

// The validation message of the task file kBase + `extra` ("" when it is valid).
std::string Refusal(const std::string& extra) {
  absl::StatusOr<common::v1::TaskSpec> spec = Parse(extra);
  if (!spec.ok()) return std::string(spec.status().message());
  absl::Status s = ValidateTaskSpec(*spec);
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(TaskPrivacyTest, ParsesThePeerLevelSectionWithItsDefaults) {
  auto spec = Parse(
      "privacy: {dp: {level: peer, clip_norm: 0.5, noise_multiplier: 1.1, delta: 1e-5, "
      "target_epsilon: 8}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ValidateTaskSpec(*spec).ok()) << ValidateTaskSpec(*spec);
  ASSERT_TRUE(HasDp(*spec));
  const common::v1::DpSpec& dp = spec->privacy().dp();
  EXPECT_EQ(dp.level(), common::v1::DP_LEVEL_PEER);
  EXPECT_DOUBLE_EQ(dp.clip_norm(), 0.5);
  EXPECT_DOUBLE_EQ(dp.noise_multiplier(), 1.1);
  EXPECT_DOUBLE_EQ(dp.delta(), 1e-5);
  EXPECT_DOUBLE_EQ(dp.target_epsilon(), 8);
  EXPECT_EQ(dp.noise(), common::v1::DP_NOISE_CENTRAL);  // the default

  auto distributed = Parse(
      "privacy: {dp: {level: peer, clip_norm: 1, noise_multiplier: 1, delta: 1e-5, "
      "noise: distributed}}\n");
  ASSERT_TRUE(distributed.ok());
  EXPECT_EQ(distributed->privacy().dp().noise(), common::v1::DP_NOISE_DISTRIBUTED);
  EXPECT_FALSE(distributed->privacy().dp().has_target_epsilon());
  EXPECT_TRUE(ValidateTaskSpec(*distributed).ok());

  // A task without the section has no DP, and shows none.
  auto plain = Parse("");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(HasDp(*plain));
  EXPECT_THAT(MessageToFriendlyJson(*plain), HasSubstr("\"privacy\":null"));
  auto plain_shown = ParseTaskSpec(MessageToFriendlyJson(*plain), "shown.json");
  ASSERT_TRUE(plain_shown.ok()) << plain_shown.status();
  EXPECT_FALSE(HasDp(*plain_shown));
  // A shown DP task parses back to the same spec.
  auto shown = ParseTaskSpec(MessageToFriendlyJson(*spec), "shown.json");
  ASSERT_TRUE(shown.ok()) << shown.status();
  EXPECT_EQ(shown->privacy().DebugString(), spec->privacy().DebugString());
}

TEST(TaskPrivacyTest, BadValuesAreRefusedNamingTheField) {
  const std::string ok = "level: peer, clip_norm: 1, noise_multiplier: 1, delta: 1e-5";
  auto with = [](const std::string& dp) { return absl::StrCat("privacy: {dp: {", dp, "}}\n"); };
  EXPECT_EQ(Refusal(with(ok)), "");
  EXPECT_EQ(Refusal(with("level: peer, clip_norm: 0, noise_multiplier: 1, delta: 1e-5")),
            "privacy.dp.clip_norm: must be > 0, got 0");
  EXPECT_EQ(Refusal(with("level: peer, clip_norm: -2, noise_multiplier: 1, delta: 1e-5")),
            "privacy.dp.clip_norm: must be > 0, got -2");
  EXPECT_EQ(Refusal(with("level: peer, clip_norm: 1, noise_multiplier: -0.5, delta: 1e-5")),
            "privacy.dp.noise_multiplier: must be >= 0, got -0.5");
  EXPECT_EQ(Refusal(with("level: peer, clip_norm: 1, noise_multiplier: 1")),
            "privacy.dp.delta: must be in (0, 1), e.g. 1e-5, got 0");
  EXPECT_EQ(Refusal(with("level: peer, clip_norm: 1, noise_multiplier: 1, delta: 1")),
            "privacy.dp.delta: must be in (0, 1), e.g. 1e-5, got 1");
  EXPECT_EQ(Refusal(with(ok + ", target_epsilon: 0")),
            "privacy.dp.target_epsilon: must be > 0, got 0");
  EXPECT_EQ(Refusal(with(ok + ", target_epsilon: -1")),
            "privacy.dp.target_epsilon: must be > 0, got -1");
  // A budget smaller than one round with every peer taking part.
  EXPECT_THAT(Refusal(with(ok + ", target_epsilon: 0.5")),
              HasSubstr("privacy.dp.target_epsilon: one round at noise_multiplier 1 already "
                        "spends epsilon"));
  EXPECT_EQ(Refusal(with("clip_norm: 1, noise_multiplier: 1, delta: 1e-5")),
            "privacy.dp.level: required (peer or sample)");
  EXPECT_THAT(Refusal(with("level: nope, clip_norm: 1")), HasSubstr("privacy.dp.level"));
  // A spec that arrives without a file (over gRPC) may leave noise unset: central.
  auto spec = Parse(with(ok));
  ASSERT_TRUE(spec.ok());
  spec->mutable_privacy()->mutable_dp()->clear_noise();
  EXPECT_TRUE(ValidateTaskSpec(*spec).ok()) << ValidateTaskSpec(*spec);
}

TEST(TaskPrivacyTest, WhatIsNotSupportedYetIsRefusedClearly) {
  const std::string dp =
      "privacy: {dp: {level: peer, clip_norm: 1, noise_multiplier: 1, delta: 1e-5}}\n";
  EXPECT_THAT(Refusal("mode: federated-async\n" + dp),
              HasSubstr("privacy.dp: differential privacy is supported in federated-sync or "
                        "decentralized or gossip tasks only; not supported yet in mode "
                        "federated-async"));
  // Gossip serves whole models, never a clipped update of a round: only level sample.
  EXPECT_THAT(Refusal("mode: gossip\n" + dp),
              HasSubstr("privacy.dp.level: peer is not supported in gossip tasks: a gossip peer "
                        "serves its whole model"));
  EXPECT_THAT(Refusal("aggregation: median\n" + dp),
              HasSubstr("aggregation: median is not supported with differential privacy"));
  EXPECT_THAT(Refusal("aggregation: krum\naggregation_options: {byzantine_peers: 1}\n"
                      "min_participants: 5\n" +
                      dp),
              HasSubstr("aggregation: krum is not supported with differential privacy"));
  EXPECT_THAT(Refusal("aggregation_options: {exact_sum: true}\n" + dp),
              HasSubstr("aggregation_options.exact_sum: not supported yet"));
  EXPECT_THAT(Refusal("straggler_factor: 3\n" + dp), HasSubstr("straggler_factor: not supported"));
  EXPECT_THAT(Refusal("compression: topk\n" + dp), HasSubstr("compression: topk is not supported"));
  // Quantising compression is fine: the aggregator clips again on arrival.
  EXPECT_EQ(Refusal("compression: int8\n" + dp), "");
  EXPECT_EQ(Refusal("compression: fp16\n" + dp), "");
}

TEST(TaskPrivacyTest, PeerLevelRunsOnATreeWithoutReplicas) {
  for (const char* noise : {"central", "distributed"}) {
    const std::string dp = absl::StrCat(
        "privacy: {dp: {level: peer, clip_norm: 1, noise_multiplier: 1, delta: 1e-5, noise: ",
        noise, "}}\n");
    // The clusters add clipped updates; the root alone adds the noise.
    EXPECT_EQ(Refusal("topology: hierarchical\ncluster_size: 4\nfanout: 2\n" + dp), "") << noise;
    EXPECT_EQ(Refusal("topology: hierarchical\nreplicas: 1\n" + dp), "") << noise;
    EXPECT_EQ(Refusal("topology: hierarchical\nreplicas: 2\n" + dp),
              "replicas: not supported yet with privacy.dp at level peer on a tree (a backup "
              "that takes over a cluster's or the root's round would have to add the noise "
              "exactly once, and nothing ensures that yet); remove it or set 1 (privacy.dp is "
              "set)")
        << noise;
    // What a flat task refuses with DP, a tree refuses too.
    EXPECT_THAT(Refusal("topology: hierarchical\naggregation: median\n" + dp),
                HasSubstr("aggregation: median is not supported with differential privacy"));
  }
}

TEST(TaskPrivacyTest, SampleLevelTakesAnyStrategyAndCompressionButNoNoiseChoice) {
  const std::string dp =
      "privacy: {dp: {level: sample, clip_norm: 1, noise_multiplier: 1.1, delta: 1e-5, "
      "target_epsilon: 3}}\n";
  auto spec = Parse(dp);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->privacy().dp().level(), common::v1::DP_LEVEL_SAMPLE);
  // No noise default: the aggregator adds none, each peer's DP-SGD step does.
  EXPECT_EQ(spec->privacy().dp().noise(), common::v1::DP_NOISE_UNSPECIFIED);
  // Each update is already private: strategies and compression only post-process it.
  EXPECT_EQ(Refusal("aggregation: median\n" + dp), "");
  EXPECT_EQ(Refusal("compression: topk\n" + dp), "");
  EXPECT_EQ(Refusal("aggregation_options: {exact_sum: true}\n" + dp), "");
  EXPECT_EQ(Refusal("privacy: {dp: {level: sample, clip_norm: 1, noise_multiplier: 1.1, "
                    "delta: 1e-5, noise: distributed}}\n"),
            "privacy.dp.noise: applies to level peer only: at level sample each peer's DP-SGD "
            "step adds the noise (remove it)");
  EXPECT_EQ(Refusal("privacy: {dp: {level: sample, clip_norm: 0, noise_multiplier: 1.1, "
                    "delta: 1e-5}}\n"),
            "privacy.dp.clip_norm: must be > 0, got 0");
  // On a tree each peer's update is private already: the aggregators only add.
  EXPECT_EQ(Refusal("topology: hierarchical\n" + dp), "");
  EXPECT_EQ(Refusal("topology: hierarchical\nreplicas: 2\naggregation: median\n" + dp), "");
  // Gossip peers train a fixed number of steps: the status shows epsilon, no target stops them.
  EXPECT_THAT(Refusal("mode: gossip\n" + dp),
              HasSubstr("privacy.dp.target_epsilon: not supported in gossip tasks"));
  EXPECT_EQ(Refusal("mode: gossip\nprivacy: {dp: {level: sample, clip_norm: 1, "
                    "noise_multiplier: 1.1, delta: 1e-5}}\n"),
            "");
  // Decentralized peers share what their DP-SGD steps trained, with or without masks.
  EXPECT_EQ(Refusal("mode: decentralized\n" + dp), "");
  EXPECT_EQ(Refusal("mode: decentralized\nmin_participants: 3\n"
                    "privacy: {secure_aggregation: {clip_norm: 1}, dp: {level: sample, "
                    "clip_norm: 1, noise_multiplier: 1.1, delta: 1e-5}}\n"),
            "");
}

// Decentralized peers add the noise themselves: the full noise to an update every other
// participant sees, a share only where secure aggregation reveals just the sum.
TEST(TaskPrivacyTest, DecentralizedPeerLevelNoiseIsAddedByEachParticipant) {
  const std::string dp = "clip_norm: 1, noise_multiplier: 1, delta: 1e-5";
  const std::string decentralized = "mode: decentralized\nmin_participants: 3\n";
  auto clear = Parse(decentralized + "privacy: {dp: {level: peer, " + dp + "}}\n");
  ASSERT_TRUE(clear.ok()) << clear.status();
  EXPECT_EQ(clear->privacy().dp().noise(), common::v1::DP_NOISE_CENTRAL);
  EXPECT_EQ(
      Refusal(decentralized + "privacy: {dp: {level: peer, noise: distributed, " + dp + "}}\n"),
      "privacy.dp.noise: distributed needs privacy.secure_aggregation in decentralized "
      "tasks: every participant sees each update in the clear, so each must carry the full "
      "noise (use noise: central)");
  auto masked =
      Parse(decentralized + "privacy: {secure_aggregation: {}, dp: {level: peer, " + dp + "}}\n");
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ(masked->privacy().dp().noise(), common::v1::DP_NOISE_DISTRIBUTED);
  EXPECT_EQ(SecureClipNorm(*masked), 1.0);
  EXPECT_EQ(Refusal(decentralized +
                    "privacy: {secure_aggregation: {}, dp: {level: peer, "
                    "noise: central, " +
                    dp + "}}\n"),
            "");
  // As in federated-sync: one round (every participant, sampling rate 1) must fit the target,
  // and the noise is calibrated to a mean of clipped updates.
  EXPECT_THAT(
      Refusal(decentralized + "privacy: {dp: {level: peer, target_epsilon: 0.5, " + dp + "}}\n"),
      HasSubstr("privacy.dp.target_epsilon: one round at noise_multiplier 1"));
  EXPECT_THAT(
      Refusal(decentralized + "aggregation: median\nprivacy: {dp: {level: peer, " + dp + "}}\n"),
      HasSubstr("aggregation: median is not supported with differential privacy"));
}

TEST(TaskPrivacyTest, SecureAggregationParsesAndRefusesWhatCannotGoWithIt) {
  const std::string sa = "privacy: {secure_aggregation: {clip_norm: 2}}\n";
  const std::string three = "min_participants: 3\n";
  auto spec = Parse(three +
                    "privacy: {secure_aggregation: {clip_norm: 2, threshold: 3, "
                    "neighbourhood_size: 4}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(HasSecureAggregation(*spec));
  EXPECT_FALSE(HasDp(*spec));
  EXPECT_DOUBLE_EQ(spec->privacy().secure_aggregation().clip_norm(), 2);
  EXPECT_EQ(spec->privacy().secure_aggregation().threshold(), 3u);
  EXPECT_EQ(spec->privacy().secure_aggregation().neighbourhood_size(), 4u);
  EXPECT_EQ(Refusal(three + "privacy: {secure_aggregation: {clip_norm: 2, threshold: 2, "
                            "neighbourhood_size: 2}}\n"),
            "");
  EXPECT_EQ(Refusal(three + sa), "");
  EXPECT_FALSE(HasSecureAggregation(*Parse("")));

  EXPECT_THAT(Refusal(three + "privacy: {secure_aggregation: {clip_norm: 0}}\n"),
              HasSubstr("privacy.secure_aggregation.clip_norm: must be > 0, got 0"));
  EXPECT_THAT(Refusal(sa), HasSubstr("min_participants: must be at least 3"));
  EXPECT_THAT(Refusal(three + "privacy: {secure_aggregation: {clip_norm: 1, threshold: 3}}\n"),
              HasSubstr("privacy.secure_aggregation.threshold: 3 exceeds the 2 neighbours"));
  EXPECT_THAT(Refusal("min_participants: 5\n"
                      "privacy: {secure_aggregation: {clip_norm: 1, threshold: 2}}\n"),
              HasSubstr("privacy.secure_aggregation.threshold: 2 must be more than half"));
  EXPECT_THAT(Refusal("mode: federated-async\nasync: {buffer_size: 3}\n" + three + sa),
              HasSubstr("privacy.secure_aggregation: supported in federated-sync or "
                        "decentralized tasks only; not in mode federated-async: its buffer "
                        "aggregates each update"));
  EXPECT_THAT(Refusal(absl::StrCat("mode: gossip\n", three, sa)),
              HasSubstr("not in mode gossip: gossip exchanges whole models between two peers at a "
                        "time and cannot take masks"));
  // Decentralized: every participant masks with every other one, no Shamir shares; the rest of
  // the checks are the federated ones.
  const std::string decentralized = "mode: decentralized\n" + three;
  EXPECT_EQ(Refusal(decentralized + sa), "");
  EXPECT_THAT(
      Refusal(decentralized + "privacy: {secure_aggregation: {clip_norm: 1, threshold: 2}}\n"),
      HasSubstr("privacy.secure_aggregation.threshold: must be 0 in a decentralized task"));
  EXPECT_THAT(
      Refusal(decentralized +
              "privacy: {secure_aggregation: {clip_norm: 1, neighbourhood_size: 2}}\n"),
      HasSubstr(
          "privacy.secure_aggregation.neighbourhood_size: must be 0 in a decentralized task"));
  EXPECT_THAT(Refusal("mode: decentralized\n" + sa),
              HasSubstr("min_participants: must be at least 3"));
  EXPECT_THAT(Refusal(decentralized + "aggregation: median\n" + sa),
              HasSubstr("aggregation: median must see each update"));
  EXPECT_THAT(Refusal(decentralized + "compression: int8\n" + sa),
              HasSubstr("compression: a masked update is uniformly random"));
  EXPECT_THAT(Refusal(decentralized + "max_update_norm: 5\n" + sa),
              HasSubstr("max_update_norm: nobody can check a masked update's norm"));
  for (const char* strategy : {"median", "trimmed-mean", "centered-clipping"}) {
    const char* options = std::string(strategy) == "centered-clipping"
                              ? "aggregation_options: {clip_radius: 1}\n"
                              : "";
    EXPECT_THAT(Refusal(absl::StrCat("aggregation: ", strategy, "\n", options, three, sa)),
                HasSubstr(absl::StrCat("aggregation: ", strategy,
                                       " must see each update, and secure aggregation reveals "
                                       "only their sum")))
        << strategy;
  }
  EXPECT_THAT(Refusal("aggregation: krum\naggregation_options: {byzantine_peers: 1}\n"
                      "min_participants: 5\n" +
                      sa),
              HasSubstr("aggregation: krum must see each update"));
  // On a tree each cluster is one secure round.
  EXPECT_EQ(Refusal(three + "topology: hierarchical\n" + sa), "");
  EXPECT_THAT(Refusal(three + "topology: hierarchical\ncluster_size: 2\n" + sa),
              HasSubstr("cluster_size: must be at least 3 on a tree"));
  // With replicas a backup that takes over a cluster starts its secure round again.
  EXPECT_EQ(Refusal(three + "topology: hierarchical\nreplicas: 2\n" + sa), "");
  EXPECT_THAT(Refusal(three + "topology: hierarchical\n" +
                      "privacy: {secure_aggregation: {clip_norm: 1, threshold: 2}}\n"),
              HasSubstr("privacy.secure_aggregation.threshold: must be 0 on a tree"));
  // With peer-level DP too: each peer adds its share of the noise before it masks (the default
  // with secure aggregation), and the root makes up the shares of the peers that did not make
  // it; central noise is added by the root alone.
  const std::string sa_dp =
      "privacy: {secure_aggregation: {}, dp: {level: peer, clip_norm: 1, noise_multiplier: 1, "
      "delta: 1e-5}}\n";
  EXPECT_EQ(Refusal(three + "topology: hierarchical\n" + sa_dp), "");
  auto tree_spec = Parse(three + "topology: hierarchical\n" + sa_dp);
  ASSERT_TRUE(tree_spec.ok()) << tree_spec.status();
  EXPECT_EQ(tree_spec->privacy().dp().noise(), common::v1::DP_NOISE_DISTRIBUTED);
  EXPECT_THAT(Refusal(three + "straggler_factor: 3\n" + sa),
              HasSubstr("straggler_factor: not supported with secure aggregation"));
  EXPECT_THAT(Refusal(three + "compression: int8\n" + sa),
              HasSubstr("compression: a masked update is uniformly random"));
  EXPECT_THAT(Refusal(three + "max_update_norm: 5\n" + sa),
              HasSubstr("max_update_norm: nobody can check a masked update's norm"));
}

// The federation's statistics are added up masked: their fixed-point encoding needs a bound on
// the feature values, required for CSV, 1 for an image folder's pixels.
TEST(TaskPrivacyTest, SecureStatisticsNeedAFeatureBound) {
  const std::string csv =
      "min_participants: 3\ndataset: {format: csv, train: train.csv, label_column: y, "
      "num_classes: 2}\n";
  EXPECT_THAT(Refusal(csv + "privacy: {secure_aggregation: {clip_norm: 1}}\n"),
              HasSubstr("privacy.secure_aggregation.feature_bound: required with normalization "
                        "standardize"));
  EXPECT_THAT(Refusal(csv + "privacy: {secure_aggregation: {clip_norm: 1, feature_bound: -1}}\n"),
              HasSubstr("privacy.secure_aggregation.feature_bound: must be > 0"));
  auto spec = Parse(csv + "privacy: {secure_aggregation: {clip_norm: 1, feature_bound: 500}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(StatisticsFeatureBound(*spec), 500);
  // With the task's own mean/std there are no federation statistics to bound.
  EXPECT_EQ(Refusal("min_participants: 3\ndataset: {format: csv, train: train.csv, "
                    "label_column: y, num_classes: 2, feature_columns: [a], mean: [0], std: [1]}\n"
                    "privacy: {secure_aggregation: {clip_norm: 1}}\n"),
            "");
  common::v1::TaskSpec images;
  images.mutable_dataset()->set_format(common::v1::DATA_FORMAT_IMAGE_FOLDER);
  EXPECT_EQ(StatisticsFeatureBound(images), 1);
}

TEST(TaskPrivacyTest, SecureAggregationCombinesWithDp) {
  const std::string three = "min_participants: 3\n";
  // Level peer: the noise defaults to distributed, and secure aggregation's clip_norm to dp's.
  auto spec = Parse(three +
                    "privacy: {secure_aggregation: {}, dp: {level: peer, clip_norm: 1.5, "
                    "noise_multiplier: 1, delta: 1e-5}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->privacy().dp().noise(), common::v1::DP_NOISE_DISTRIBUTED);
  EXPECT_DOUBLE_EQ(SecureClipNorm(*spec), 1.5);
  EXPECT_EQ(Refusal(three + "privacy: {secure_aggregation: {clip_norm: 1.5}, dp: {level: peer, "
                            "clip_norm: 1.5, noise_multiplier: 1, delta: 1e-5, noise: central}}\n"),
            "");
  EXPECT_THAT(Refusal(three + "privacy: {secure_aggregation: {clip_norm: 2}, dp: {level: peer, "
                              "clip_norm: 1.5, noise_multiplier: 1, delta: 1e-5}}\n"),
              HasSubstr("privacy.secure_aggregation.clip_norm: must equal privacy.dp.clip_norm "
                        "(1.5), or be left out"));
  // Without dp at level peer there is no clip_norm to take.
  EXPECT_THAT(Refusal(three + "privacy: {secure_aggregation: {}}\n"),
              HasSubstr("privacy.secure_aggregation.clip_norm: must be > 0, got 0"));
  // Level sample: each peer's DP-SGD step makes its update private; secure aggregation sums it.
  EXPECT_EQ(Refusal(three + "privacy: {secure_aggregation: {clip_norm: 1}, dp: {level: sample, "
                            "clip_norm: 1, noise_multiplier: 1, delta: 1e-5}}\n"),
            "");
}

}  // namespace
}  // namespace shoal::task
