// The aggregation strategies (libs/aggregation/strategy.h): hand-computed examples, order and
// thread independence, robustness against one Byzantine update, degraded rounds, errors.

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/aggregation/strategy.h"
#include "libs/aggregation/weighted_mean.h"

namespace shoal::aggregation {
namespace {

using common::v1::AggregationOptions;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

struct Update {
  std::string id;
  std::vector<float> delta;
  double weight = 1;
};

struct Outcome {
  std::vector<float> values;
  AggregationReport report;
};

tensor::ModelLayout Layout(int64_t n) { return *tensor::ModelLayout::Create({{"x", {n}}}); }

tensor::FlatModel Base(std::vector<float> values) {
  tensor::FlatModel m;
  m.layout = Layout(static_cast<int64_t>(values.size()));
  m.values = std::move(values);
  return m;
}

Strategy Make(common::v1::Aggregation kind, AggregationOptions params = {}, int threads = 1) {
  absl::StatusOr<Strategy> s = MakeStrategy({kind, params, threads});
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

AggregationOptions Params(const std::function<void(AggregationOptions&)>& set) {
  AggregationOptions p;
  set(p);
  return p;
}

Outcome RunRound(const Strategy& strategy, const tensor::FlatModel& base,
                 const std::vector<Update>& updates) {
  std::unique_ptr<Aggregation> round = strategy.Start(base.layout, updates.size());
  for (const Update& u : updates) {
    absl::Status s = round->Add(u.delta, u.weight, u.id);
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(round->count(), updates.size());
  Outcome out;
  absl::StatusOr<AggregationReport> report = round->ApplyInto(base, out.values);
  EXPECT_TRUE(report.ok()) << report.status();
  if (report.ok()) out.report = *report;
  return out;
}

// One value per update, broadcast to every coordinate of a 3-float model.
std::vector<Update> Scalars(const std::vector<float>& values) {
  std::vector<Update> updates;
  for (size_t i = 0; i < values.size(); ++i) {
    updates.push_back(
        {std::string(1, static_cast<char>('a' + i)), std::vector<float>(3, values[i])});
  }
  return updates;
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<Update> RandomUpdates(size_t k, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Update> updates;
  for (size_t u = 0; u < k; ++u) {
    Update up{absl::StrCat("peer-", u), std::vector<float>(n), 1.0 + static_cast<double>(u)};
    for (float& v : up.delta) v = normal(rng) * static_cast<float>(1 + u % 3);
    updates.push_back(std::move(up));
  }
  return updates;
}

// The robust strategies with settings for five updates of which one is Byzantine.
std::vector<Strategy> RobustStrategies(int threads = 1) {
  return {
      Make(common::v1::AGGREGATION_MEDIAN, {}, threads),
      Make(common::v1::AGGREGATION_TRIMMED_MEAN, Params([](auto& p) { p.set_trim_ratio(0.2); }),
           threads),
      Make(common::v1::AGGREGATION_KRUM, Params([](auto& p) { p.set_byzantine_peers(1); }),
           threads),
      Make(common::v1::AGGREGATION_MULTI_KRUM, Params([](auto& p) { p.set_byzantine_peers(1); }),
           threads),
      Make(common::v1::AGGREGATION_CENTERED_CLIPPING, Params([](auto& p) {
             p.set_clip_radius(1.0);
             p.set_clip_iterations(20);
           }),
           threads),
  };
}

TEST(StrategyRegistryTest, EveryAggregationValueHasExactlyOneStrategy) {
  std::vector<common::v1::Aggregation> enum_values;
  const auto& type = *common::v1::Aggregation_descriptor();
  for (int i = 0; i < type.value_count(); ++i) {
    if (type.value(i)->number() != 0) {
      enum_values.push_back(static_cast<common::v1::Aggregation>(type.value(i)->number()));
    }
  }
  EXPECT_THAT(RegisteredStrategies(), UnorderedElementsAreArray(enum_values));
}

TEST(StrategyRegistryTest, NamesAndMemory) {
  EXPECT_EQ(StrategyName(common::v1::AGGREGATION_TRIMMED_MEAN), "trimmed-mean");
  EXPECT_EQ(StrategyName(common::v1::AGGREGATION_MULTI_KRUM), "multi-krum");
  EXPECT_EQ(StrategyName(static_cast<common::v1::Aggregation>(99)), "unknown(99)");
  const uint64_t model = 400'000'000;  // 100M floats
  Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  EXPECT_TRUE(mean.streaming());
  EXPECT_EQ(mean.name(), "mean");
  EXPECT_EQ(mean.RoundMemoryBytes(10, model), model);
  for (const Strategy& s : RobustStrategies()) {
    EXPECT_FALSE(s.streaming()) << s.name();
    EXPECT_EQ(s.RoundMemoryBytes(10, model), 10 * model) << s.name();
    EXPECT_EQ(s.RoundMemoryBytes(0, model), 0u) << s.name();
  }
}

TEST(MeanStrategyTest, BitIdenticalToWeightedMeanAccumulator) {
  for (int threads : {1, 2}) {
    const size_t n = threads == 1 ? 1001 : (size_t{1} << 23) + 17;  // the latter splits
    std::vector<Update> updates;
    if (threads == 1) {
      updates = RandomUpdates(4, n, 7);
    } else {
      for (int u = 0; u < 4; ++u) {
        updates.push_back({absl::StrCat("p", u), std::vector<float>(n), 0.5 + u});
        for (size_t i = 0; i < n; ++i) {
          updates.back().delta[i] = static_cast<float>((i * (u + 3)) % 101) * 0.013f - 0.6f;
        }
      }
    }
    tensor::FlatModel base = Base(std::vector<float>(n, 0.25f));
    WeightedMeanAccumulator reference(base.layout, threads);
    for (const Update& u : updates) ASSERT_TRUE(reference.Add(u.delta, u.weight).ok());
    std::vector<float> expected;
    ASSERT_TRUE(reference.ApplyInto(base, expected).ok());
    Outcome got = RunRound(Make(common::v1::AGGREGATION_MEAN, {}, threads), base, updates);
    EXPECT_TRUE(BitIdentical(got.values, expected)) << "threads " << threads;
    EXPECT_EQ(got.report.updates, 4u);
    EXPECT_THAT(got.report.note, IsEmpty());
  }
}

TEST(MeanStrategyTest, IsSampleWeighted) {
  std::vector<Update> updates = Scalars({1, 4});
  updates[0].weight = 3;
  updates[1].weight = 1;
  Outcome out = RunRound(Make(common::v1::AGGREGATION_MEAN), Base({10, 10, 10}), updates);
  EXPECT_FLOAT_EQ(out.values[0], 10 + (3 * 1 + 4) / 4.0f);
}

TEST(MedianStrategyTest, OddAndEvenCounts) {
  const Strategy median = Make(common::v1::AGGREGATION_MEDIAN);
  std::vector<Update> odd = Scalars({5, -1, 3});
  odd[0].weight = 1000;  // unweighted: a claimed sample count buys nothing
  EXPECT_EQ(RunRound(median, Base({1, 1, 1}), odd).values, std::vector<float>({4, 4, 4}));
  // Even: the mean of the two middle values, (2 + 3) / 2.
  EXPECT_EQ(RunRound(median, Base({0, 0, 0}), Scalars({3, 100, -7, 2})).values,
            std::vector<float>({2.5f, 2.5f, 2.5f}));
  // Per coordinate.
  std::vector<Update> mixed = {{"a", {1, 9, 0}}, {"b", {2, 8, 0}}, {"c", {3, 7, 1}}};
  EXPECT_EQ(RunRound(median, Base({0, 0, 0}), mixed).values, std::vector<float>({2, 8, 0}));
}

TEST(TrimmedMeanStrategyTest, DropsTheExtremes) {
  const Strategy trimmed =
      Make(common::v1::AGGREGATION_TRIMMED_MEAN, Params([](auto& p) { p.set_trim_ratio(0.2); }));
  // floor(0.2 x 5) = 1 at each end: mean of 2, 3, 4.
  Outcome out = RunRound(trimmed, Base({0, 0, 0}), Scalars({4, 100, 2, -50, 3}));
  EXPECT_EQ(out.values, std::vector<float>({3, 3, 3}));
  EXPECT_THAT(out.report.note, IsEmpty());
  // floor(0.4 x 10) = 4: the middle two of 0..9.
  const Strategy wide =
      Make(common::v1::AGGREGATION_TRIMMED_MEAN, Params([](auto& p) { p.set_trim_ratio(0.4); }));
  EXPECT_EQ(RunRound(wide, Base({1, 1, 1}), Scalars({9, 8, 7, 6, 5, 4, 3, 2, 1, 0})).values,
            std::vector<float>({5.5f, 5.5f, 5.5f}));
  EXPECT_DOUBLE_EQ(Make(common::v1::AGGREGATION_TRIMMED_MEAN).params().trim_ratio(), 0.1);
}

TEST(KrumStrategyTest, PicksTheUpdateClosestToItsNeighbours) {
  // K = 5, f = 1: each score sums the 2 smallest squared distances (x3 coordinates):
  // a=0: 1+4, b=1: 1+1, c=2: 1+1, d=3: 1+4, e=100: 97^2+98^2. b and c tie; b has the smaller id.
  const std::vector<Update> updates = Scalars({0, 1, 2, 3, 100});
  const auto f1 = Params([](auto& p) { p.set_byzantine_peers(1); });
  Outcome krum = RunRound(Make(common::v1::AGGREGATION_KRUM, f1), Base({10, 10, 10}), updates);
  EXPECT_EQ(krum.values, std::vector<float>({11, 11, 11}));
  EXPECT_EQ(krum.report.selected, std::vector<std::string>({"b"}));
  EXPECT_THAT(krum.report.note, IsEmpty());
  // multi-krum, m = K - f = 4: a, b, c, d.
  Outcome multi = RunRound(Make(common::v1::AGGREGATION_MULTI_KRUM, f1), Base({0, 0, 0}), updates);
  EXPECT_EQ(multi.values, std::vector<float>({1.5f, 1.5f, 1.5f}));
  EXPECT_EQ(multi.report.selected, std::vector<std::string>({"a", "b", "c", "d"}));
  // m = 3: b, c and, of a and d (tied), a.
  const auto m3 = Params([](auto& p) {
    p.set_byzantine_peers(1);
    p.set_multi_krum_selected(3);
  });
  Outcome three = RunRound(Make(common::v1::AGGREGATION_MULTI_KRUM, m3), Base({0, 0, 0}), updates);
  EXPECT_EQ(three.values, std::vector<float>({1, 1, 1}));
  EXPECT_EQ(three.report.selected, std::vector<std::string>({"a", "b", "c"}));
}

TEST(CenteredClippingStrategyTest, ClipsEachPullToTheRadius) {
  // K = 2, tau = 2. From v = 0: |1| <= 2 counts fully, 10 is clipped to 2: v = (1 + 2) / 2.
  const std::vector<Update> updates = {{"a", {1}}, {"b", {10}}};
  auto params = [](uint32_t iterations) {
    return Params([iterations](auto& p) {
      p.set_clip_radius(2);
      p.set_clip_iterations(iterations);
    });
  };
  EXPECT_EQ(RunRound(Make(common::v1::AGGREGATION_CENTERED_CLIPPING, params(1)), Base({5}), updates)
                .values,
            std::vector<float>({6.5f}));
  // Second iteration from v = 1.5: 1 - 1.5 = -0.5 counts fully, 8.5 is clipped to 2:
  // v = 1.5 + (-0.5 + 2) / 2 = 2.25.
  EXPECT_EQ(RunRound(Make(common::v1::AGGREGATION_CENTERED_CLIPPING, params(2)), Base({0}), updates)
                .values,
            std::vector<float>({2.25f}));
  // A radius no update reaches: one iteration is the plain mean.
  const auto wide = Params([](auto& p) {
    p.set_clip_radius(100);
    p.set_clip_iterations(1);
  });
  EXPECT_EQ(
      RunRound(Make(common::v1::AGGREGATION_CENTERED_CLIPPING, wide), Base({0}), updates).values,
      std::vector<float>({5.5f}));
  EXPECT_EQ(
      Make(common::v1::AGGREGATION_CENTERED_CLIPPING, Params([](auto& p) { p.set_clip_radius(1); }))
          .params()
          .clip_iterations(),
      3u);
}

TEST(StrategyDeterminismTest, OrderOfAddsDoesNotChangeTheResult) {
  const std::vector<Update> updates = RandomUpdates(7, 5003, 11);
  const tensor::FlatModel base = Base(std::vector<float>(5003, -0.5f));
  for (const Strategy& strategy : RobustStrategies()) {
    const Outcome first = RunRound(strategy, base, updates);
    std::vector<Update> shuffled = updates;
    std::mt19937 rng(3);
    for (int trial = 0; trial < 4; ++trial) {
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      const Outcome again = RunRound(strategy, base, shuffled);
      EXPECT_TRUE(BitIdentical(first.values, again.values)) << strategy.name() << " " << trial;
      EXPECT_EQ(first.report.selected, again.report.selected) << strategy.name();
    }
  }
}

TEST(StrategyDeterminismTest, ThreadsDoNotChangeTheResult) {
  const size_t n = (size_t{1} << 20) + 37;  // large enough for every pass to split
  const std::vector<Update> updates = RandomUpdates(5, n, 5);
  const tensor::FlatModel base = Base(std::vector<float>(n, 1.0f));
  const std::vector<Strategy> one = RobustStrategies(1), three = RobustStrategies(3);
  for (size_t s = 0; s < one.size(); ++s) {
    EXPECT_TRUE(BitIdentical(RunRound(one[s], base, updates).values,
                             RunRound(three[s], base, updates).values))
        << one[s].name();
  }
}

// Four honest updates around a common direction g plus one Byzantine update, which also claims
// a huge sample count. The weighted mean is dragged away; every robust strategy stays near the
// honest mean.
class ByzantineTest : public ::testing::TestWithParam<float> {};

TEST_P(ByzantineTest, RobustStrategiesStayNearTheHonestMean) {
  const std::vector<float> g = {1, -2, 0.5f, 3, -1, 2, 0.25f, -0.75f};
  const size_t n = g.size();
  double g_norm = 0;
  for (float v : g) g_norm += static_cast<double>(v) * v;
  g_norm = std::sqrt(g_norm);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<Update> updates;
  std::vector<double> honest_mean(n, 0.0);
  for (int i = 0; i < 4; ++i) {
    Update u{absl::StrCat("honest-", i), g, 10};
    for (size_t j = 0; j < n; ++j) {
      u.delta[j] += noise(rng);
      honest_mean[j] += u.delta[j] / 4.0;
    }
    updates.push_back(std::move(u));
  }
  Update bad{"byzantine", g, 1000};
  for (float& v : bad.delta) v *= GetParam();
  updates.push_back(bad);
  const tensor::FlatModel base = Base(std::vector<float>(n, 0.0f));
  auto error = [&](const std::vector<float>& got) {
    double sum = 0;
    for (size_t j = 0; j < n; ++j) sum += (got[j] - honest_mean[j]) * (got[j] - honest_mean[j]);
    return std::sqrt(sum) / g_norm;  // relative to |g|
  };
  EXPECT_GT(error(RunRound(Make(common::v1::AGGREGATION_MEAN), base, updates).values), 1.0);
  for (const Strategy& strategy : RobustStrategies()) {
    const Outcome out = RunRound(strategy, base, updates);
    EXPECT_LT(error(out.values), 0.1) << strategy.name();
    EXPECT_THAT(out.report.selected, ::testing::Not(::testing::Contains("byzantine")))
        << strategy.name();
  }
}

INSTANTIATE_TEST_SUITE_P(Attacks, ByzantineTest, ::testing::Values(-10.0f, -1.0f),
                         [](const ::testing::TestParamInfo<float>& info) {
                           return info.param < -5 ? std::string("ScaledMinus10")
                                                  : std::string("SignFlipped");
                         });

TEST(DegradedRoundTest, KrumUsesTheLargestFThatFits) {
  const auto f2 = Params([](auto& p) { p.set_byzantine_peers(2); });
  // K = 5 < 2f+3 = 7: f' = 1, as in KrumStrategyTest.
  Outcome out =
      RunRound(Make(common::v1::AGGREGATION_KRUM, f2), Base({0, 0, 0}), Scalars({0, 1, 2, 3, 100}));
  EXPECT_EQ(out.values, std::vector<float>({1, 1, 1}));
  EXPECT_THAT(out.report.note, HasSubstr("krum: 5 updates fit byzantine_peers 1, not the "
                                         "configured 2"));
  // multi-krum averages K - f' = 4.
  Outcome multi = RunRound(Make(common::v1::AGGREGATION_MULTI_KRUM, f2), Base({0, 0, 0}),
                           Scalars({0, 1, 2, 3, 100}));
  EXPECT_EQ(multi.values, std::vector<float>({1.5f, 1.5f, 1.5f}));
  EXPECT_THAT(multi.report.note, HasSubstr("multi-krum: 5 updates fit byzantine_peers 1"));
}

TEST(DegradedRoundTest, KrumBelowThreeUpdatesFallsBackToTheMedian) {
  const auto f1 = Params([](auto& p) { p.set_byzantine_peers(1); });
  for (auto kind : {common::v1::AGGREGATION_KRUM, common::v1::AGGREGATION_MULTI_KRUM}) {
    Outcome two = RunRound(Make(kind, f1), Base({1, 1, 1}), Scalars({2, 6}));
    EXPECT_EQ(two.values, std::vector<float>({5, 5, 5}));
    EXPECT_THAT(two.report.note, HasSubstr("2 updates are too few"));
    EXPECT_THAT(two.report.note, HasSubstr("used the coordinate-wise median"));
    Outcome one = RunRound(Make(kind, f1), Base({1, 1, 1}), Scalars({2}));
    EXPECT_EQ(one.values, std::vector<float>({3, 3, 3}));
  }
}

TEST(DegradedRoundTest, MultiKrumSelectsAtMostKMinusF) {
  const auto m9 = Params([](auto& p) {
    p.set_byzantine_peers(1);
    p.set_multi_krum_selected(9);
  });
  Outcome out = RunRound(Make(common::v1::AGGREGATION_MULTI_KRUM, m9), Base({0, 0, 0}),
                         Scalars({0, 1, 2, 3, 100}));
  EXPECT_EQ(out.report.selected.size(), 4u);
  EXPECT_THAT(out.report.note, HasSubstr("averaged 4 updates (K - f), not the configured 9"));
}

TEST(DegradedRoundTest, TrimmedMeanThatTrimsNothingSaysSo) {
  const Strategy trimmed =
      Make(common::v1::AGGREGATION_TRIMMED_MEAN, Params([](auto& p) { p.set_trim_ratio(0.2); }));
  Outcome out = RunRound(trimmed, Base({0, 0, 0}), Scalars({1, 2, 3, 10}));  // floor(0.8) = 0
  EXPECT_EQ(out.values, std::vector<float>({4, 4, 4}));
  EXPECT_THAT(out.report.note, HasSubstr("4 updates at trim_ratio 0.2 trim none"));
}

TEST(DegradedRoundTest, NoUpdatesGiveTheBase) {
  for (const Strategy& strategy : RobustStrategies()) {
    Outcome out = RunRound(strategy, Base({1, 2, 3}), {});
    EXPECT_EQ(out.values, std::vector<float>({1, 2, 3})) << strategy.name();
    EXPECT_EQ(out.report.updates, 0u);
    EXPECT_THAT(out.report.note, HasSubstr("no updates")) << strategy.name();
  }
}

TEST(AggregationErrorsTest, BadInputIsRefusedAndNothingIsAdded) {
  std::vector<Strategy> all = RobustStrategies();
  all.push_back(Make(common::v1::AGGREGATION_MEAN));
  const tensor::ModelLayout layout = *tensor::ModelLayout::Create({{"w", {2, 2}}, {"b", {2}}});
  for (const Strategy& strategy : all) {
    SCOPED_TRACE(strategy.name());
    std::unique_ptr<Aggregation> round = strategy.Start(layout, 3);
    const std::vector<float> ok(6, 1.0f);
    auto code = [](const absl::Status& s) { return s.code(); };
    EXPECT_EQ(code(round->Add(std::vector<float>{1, 2}, 1, "a")),
              absl::StatusCode::kInvalidArgument);
    for (double w : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      EXPECT_EQ(code(round->Add(ok, w, "a")), absl::StatusCode::kInvalidArgument) << w;
    }
    std::vector<float> nan = ok;
    nan[5] = std::numeric_limits<float>::quiet_NaN();
    absl::Status bad = round->Add(nan, 1, "a");
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.message()), HasSubstr("tensor 'b' element 1"));
    EXPECT_EQ(round->count(), 0u);

    ASSERT_TRUE(round->Add(ok, 2, "a").ok());
    absl::Status twice = round->Add(ok, 2, "a");
    EXPECT_THAT(std::string(twice.message()), HasSubstr("contributor \"a\" already added"));
    EXPECT_EQ(round->count(), 1u);
    EXPECT_DOUBLE_EQ(round->total_weight(), 2);

    tensor::FlatModel other = Base(std::vector<float>(6, 0.0f));  // layout x[6]
    std::vector<float> out;
    EXPECT_EQ(round->ApplyInto(other, out).status().code(), absl::StatusCode::kInvalidArgument);
    tensor::FlatModel base{layout, std::vector<float>(6, 0.0f)};
    EXPECT_EQ(round->ApplyInto(base, base.values).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(AggregationResetTest, ANewRoundReusesTheBuffers) {
  for (const Strategy& strategy : RobustStrategies()) {
    const tensor::FlatModel base = Base({0, 0, 0});
    std::unique_ptr<Aggregation> round = strategy.Start(base.layout, 2);
    for (const Update& u : Scalars({50, 60, 70})) ASSERT_TRUE(round->Add(u.delta, 1, u.id).ok());
    round->Reset();
    EXPECT_EQ(round->count(), 0u);
    for (const Update& u : Scalars({2, 2, 2, 2, 2})) ASSERT_TRUE(round->Add(u.delta, 1, u.id).ok());
    std::vector<float> out = {9};  // a recycled buffer of another size
    ASSERT_TRUE(round->ApplyInto(base, out).ok());
    EXPECT_EQ(out, std::vector<float>({2, 2, 2})) << strategy.name();
  }
}

TEST(MakeStrategyTest, RefusesParametersOfOtherStrategiesAndBadRanges) {
  struct Case {
    common::v1::Aggregation kind;
    std::function<void(AggregationOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {common::v1::AGGREGATION_UNSPECIFIED, [](auto&) {},
       "aggregation: unsupported value \"unspecified\" (expected mean, median, trimmed-mean, "
       "krum, multi-krum, centered-clipping)"},
      {common::v1::AGGREGATION_MEDIAN, [](auto& p) { p.set_trim_ratio(0.1); },
       "aggregation_options.trim_ratio: used only by aggregation trimmed-mean, but aggregation "
       "is median"},
      {common::v1::AGGREGATION_MEAN, [](auto& p) { p.set_byzantine_peers(1); },
       "aggregation_options.byzantine_peers: used only by aggregation krum or multi-krum"},
      {common::v1::AGGREGATION_KRUM,
       [](auto& p) {
         p.set_byzantine_peers(1);
         p.set_multi_krum_selected(2);
       },
       "aggregation_options.multi_krum_selected: used only by aggregation multi-krum"},
      {common::v1::AGGREGATION_TRIMMED_MEAN, [](auto& p) { p.set_trim_ratio(0.5); },
       "aggregation_options.trim_ratio: must be in [0, 0.5), got 0.5"},
      {common::v1::AGGREGATION_TRIMMED_MEAN, [](auto& p) { p.set_trim_ratio(-0.1); },
       "aggregation_options.trim_ratio: must be in [0, 0.5)"},
      {common::v1::AGGREGATION_KRUM, [](auto&) {}, "aggregation_options.byzantine_peers: required"},
      {common::v1::AGGREGATION_MULTI_KRUM,
       [](auto& p) {
         p.set_byzantine_peers(1);
         p.set_multi_krum_selected(0);
       },
       "aggregation_options.multi_krum_selected: must be >= 1"},
      {common::v1::AGGREGATION_CENTERED_CLIPPING, [](auto&) {},
       "aggregation_options.clip_radius: required"},
      {common::v1::AGGREGATION_CENTERED_CLIPPING, [](auto& p) { p.set_clip_radius(0); },
       "aggregation_options.clip_radius: must be > 0, got 0"},
      {common::v1::AGGREGATION_CENTERED_CLIPPING,
       [](auto& p) {
         p.set_clip_radius(1);
         p.set_clip_iterations(101);
       },
       "aggregation_options.clip_iterations: must be in 1..100, got 101"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Strategy> s = MakeStrategy({c.kind, Params(c.set), 1});
    ASSERT_FALSE(s.ok()) << c.message;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace shoal::aggregation
