// Partial sums (what a supernode forwards to its parent) and exact summation: a tree of partial
// sums gives flat FedAvg's model, bit-identical with exact_sum whatever the order and grouping,
// within float rounding without it.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/aggregation/strategy.h"
#include "libs/aggregation/weighted_mean.h"

namespace shoal::aggregation {
namespace {

using ::testing::HasSubstr;

struct Update {
  std::vector<float> delta;
  double weight = 1;
};

tensor::ModelLayout Layout(int64_t n) {
  return *tensor::ModelLayout::Create({{"w", {n - 3}}, {"b", {3}}});
}

tensor::FlatModel Base(int64_t n) {
  tensor::FlatModel base;
  base.layout = Layout(n);
  base.values.resize(n);
  for (int64_t i = 0; i < n; ++i) base.values[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  return base;
}

// Deltas of mixed magnitudes (so float sums round differently in different orders) and weights
// that are sample counts, or sample counts times a staleness weight.
std::vector<Update> RandomUpdates(size_t k, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> samples(1, 6000);
  std::vector<Update> updates(k);
  for (size_t u = 0; u < k; ++u) {
    const float scale = std::pow(10.0f, static_cast<float>(u % 5) - 3.0f);
    updates[u].delta.resize(n);
    for (float& v : updates[u].delta) v = normal(rng) * scale;
    updates[u].weight =
        samples(rng) * (u % 3 == 0 ? 1.0 / (1.0 + static_cast<double>(u % 4)) : 1.0);
  }
  return updates;
}

std::vector<float> Flat(const std::vector<Update>& updates, const std::vector<size_t>& order,
                        Summation summation, const tensor::FlatModel& base) {
  WeightedMeanAccumulator acc(base.layout, 1, summation);
  for (size_t i : order) EXPECT_TRUE(acc.Add(updates[i].delta, updates[i].weight).ok());
  std::vector<float> out;
  EXPECT_TRUE(acc.ApplyInto(base, out).ok());
  return out;
}

// A two-level tree: leaves of `cluster` updates each (taken in `order`), inner nodes of
// `fanout` leaves, a root adding the inner nodes' partials in reverse.
std::vector<float> Tree(const std::vector<Update>& updates, const std::vector<size_t>& order,
                        size_t cluster, size_t fanout, Summation summation,
                        const tensor::FlatModel& base) {
  std::vector<PartialSum> leaves;
  for (size_t begin = 0; begin < order.size(); begin += cluster) {
    WeightedMeanAccumulator leaf(base.layout, 1, summation);
    for (size_t i = begin; i < std::min(order.size(), begin + cluster); ++i) {
      EXPECT_TRUE(leaf.Add(updates[order[i]].delta, updates[order[i]].weight).ok());
    }
    leaves.push_back(leaf.Partial());
  }
  std::vector<PartialSum> inner;
  for (size_t begin = 0; begin < leaves.size(); begin += fanout) {
    WeightedMeanAccumulator node(base.layout, 1, summation);
    for (size_t i = begin; i < std::min(leaves.size(), begin + fanout); ++i) {
      EXPECT_TRUE(node.AddPartial(leaves[i]).ok());
    }
    inner.push_back(node.Partial());
  }
  WeightedMeanAccumulator root(base.layout, 1, summation);
  for (auto it = inner.rbegin(); it != inner.rend(); ++it) EXPECT_TRUE(root.AddPartial(*it).ok());
  EXPECT_EQ(root.count(), updates.size());
  std::vector<float> out;
  EXPECT_TRUE(root.ApplyInto(base, out).ok());
  return out;
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<size_t> Shuffled(size_t k, uint32_t seed) {
  std::vector<size_t> order(k);
  for (size_t i = 0; i < k; ++i) order[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

TEST(PartialSumTest, ExactTreeIsBitIdenticalToFlatInAnyOrderAndGrouping) {
  const size_t n = 2003, k = 70;
  const tensor::FlatModel base = Base(n);
  const std::vector<Update> updates = RandomUpdates(k, n, 11);
  const std::vector<float> flat = Flat(updates, Shuffled(k, 0), Summation::kExact, base);
  // The reference in double, for closeness.
  double total = 0;
  for (const Update& u : updates) total += u.weight;
  for (size_t i = 0; i < n; i += 97) {
    double sum = 0;
    for (const Update& u : updates) sum += u.weight * u.delta[i];
    EXPECT_NEAR(flat[i], base.values[i] + sum / total, 1e-6) << i;
  }
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const std::vector<size_t> order = Shuffled(k, seed);
    EXPECT_TRUE(BitIdentical(Flat(updates, order, Summation::kExact, base), flat)) << seed;
    for (auto [cluster, fanout] : {std::pair<size_t, size_t>{32, 2}, {7, 3}, {1, 70}, {70, 1}}) {
      EXPECT_TRUE(
          BitIdentical(Tree(updates, order, cluster, fanout, Summation::kExact, base), flat))
          << "seed " << seed << " cluster " << cluster << " fanout " << fanout;
    }
  }
}

TEST(PartialSumTest, FloatTreeIsFlatWithinFloatRounding) {
  const size_t n = 2003, k = 70;
  const tensor::FlatModel base = Base(n);
  const std::vector<Update> updates = RandomUpdates(k, n, 12);
  const std::vector<size_t> order = Shuffled(k, 5);
  const std::vector<float> flat = Flat(updates, order, Summation::kFloat, base);
  const std::vector<float> exact = Flat(updates, order, Summation::kExact, base);
  size_t differ = 0;
  for (auto [cluster, fanout] : {std::pair<size_t, size_t>{32, 2}, {7, 3}}) {
    const std::vector<float> tree = Tree(updates, order, cluster, fanout, Summation::kFloat, base);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(tree[i], flat[i], 1e-5f + 1e-5f * std::fabs(flat[i])) << i;
      EXPECT_NEAR(tree[i], exact[i], 1e-5f + 1e-5f * std::fabs(flat[i])) << i;
      differ += tree[i] != flat[i];
    }
  }
  // Mixed magnitudes: the float groupings do round differently (what exact_sum removes).
  EXPECT_GT(differ, 0u);
}

TEST(PartialSumTest, AnExactTermIsTheProductTruncatedToUnitsOfTwoToTheMinus64) {
  const size_t n = 4096;
  tensor::ModelLayout layout = *tensor::ModelLayout::Create({{"w", {static_cast<int64_t>(n)}}});
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> exponent(-70, 27);  // x 6000 stays under 2^40
  std::vector<float> delta(n);
  for (size_t i = 0; i < n; ++i) {
    delta[i] = static_cast<float>((i % 2 ? -1 : 1) * std::pow(2.0, exponent(rng)));
  }
  delta[0] = 0;
  delta[1] = -0.0f;
  delta[2] = std::nextafter(0x1p27f, 0.0f);
  delta[3] = -delta[2];
  delta[4] = std::numeric_limits<float>::denorm_min();
  for (double weight : {1.0, 1.5, 6000.0}) {
    WeightedMeanAccumulator acc(layout, 1, Summation::kExact);
    ASSERT_TRUE(acc.Add(delta, weight).ok());
    const PartialSum partial = acc.Partial();
    for (size_t i = 0; i < n; ++i) {
      const double product = weight * static_cast<double>(delta[i]);
      ASSERT_TRUE(partial.exact[i] == static_cast<ExactValue>(product * 0x1p64))
          << "value " << delta[i] << " weight " << weight;
    }
    EXPECT_TRUE(partial.exact_weight == static_cast<ExactValue>(weight * 0x1p64));
  }
}

TEST(PartialSumTest, ThreadedExactPassesMatchTheSingleThreadedOnes) {
  const int64_t n = (int64_t{1} << 22) * 2 + 101;  // split across two threads
  const tensor::FlatModel base = Base(n);
  std::vector<float> d1(n), d2(n);
  for (int64_t i = 0; i < n; ++i) {
    d1[i] = static_cast<float>(i % 101) * 0.01f;
    d2[i] = static_cast<float>(i % 37) * -0.1f;
  }
  WeightedMeanAccumulator one(base.layout, 1, Summation::kExact);
  WeightedMeanAccumulator two(base.layout, 2, Summation::kExact);
  for (auto* acc : {&one, &two}) {
    ASSERT_TRUE(acc->Add(d1, 2).ok());
    ASSERT_TRUE(acc->Add(d2, 5).ok());
  }
  std::vector<float> a, b;
  ASSERT_TRUE(one.ApplyInto(base, a).ok());
  ASSERT_TRUE(two.ApplyInto(base, b).ok());
  EXPECT_TRUE(BitIdentical(a, b));
}

TEST(PartialSumTest, ExactTermOverTheBoundIsRefusedAndLeavesTheSumAsItWas) {
  const size_t n = 10;
  const tensor::FlatModel base = Base(n);
  WeightedMeanAccumulator acc(base.layout, 1, Summation::kExact);
  ASSERT_TRUE(acc.Add(std::vector<float>(n, 0.5f), 3).ok());
  std::vector<float> before;
  ASSERT_TRUE(acc.ApplyInto(base, before).ok());
  std::vector<float> big(n, 0.25f);
  big[8] = 1e12f;  // "b" element 1
  absl::Status s = acc.Add(big, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'b' element 1"));
  EXPECT_THAT(s.message(), HasSubstr("2^40"));
  EXPECT_EQ(acc.count(), 1u);
  std::vector<float> after;
  ASSERT_TRUE(acc.ApplyInto(base, after).ok());
  EXPECT_TRUE(BitIdentical(before, after));
  EXPECT_EQ(acc.Add(std::vector<float>(n, 1), 0x1p41).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_DOUBLE_EQ(acc.total_weight(), 3);
}

TEST(PartialSumTest, BadPartialsAreRefusedWithNothingAdded) {
  const size_t n = 10;
  const tensor::FlatModel base = Base(n);
  WeightedMeanAccumulator exact(base.layout, 1, Summation::kExact);
  WeightedMeanAccumulator flt(base.layout, 1, Summation::kFloat);
  ASSERT_TRUE(exact.Add(std::vector<float>(n, 1), 1).ok());
  ASSERT_TRUE(flt.Add(std::vector<float>(n, 1), 1).ok());

  absl::Status s = flt.AddPartial(exact.Partial());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exact"));

  PartialSum short_sum = flt.Partial();
  short_sum.sum.pop_back();
  EXPECT_THAT(flt.AddPartial(short_sum).message(), HasSubstr("9 values"));

  PartialSum nan = flt.Partial();
  nan.sum[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(flt.AddPartial(nan).message(), HasSubstr("element 2 is not finite"));

  PartialSum huge = exact.Partial();
  huge.exact[0] = static_cast<ExactValue>(1) << 120;  // not a sum of one term under 2^40
  EXPECT_THAT(exact.AddPartial(huge).message(), HasSubstr("over the bound"));

  PartialSum weightless = flt.Partial();
  weightless.total_weight = 0;
  EXPECT_EQ(flt.AddPartial(weightless).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(exact.count(), 1u);
  EXPECT_EQ(flt.count(), 1u);
  // An empty partial adds nothing and is no error.
  WeightedMeanAccumulator empty(base.layout, 1, Summation::kFloat);
  EXPECT_TRUE(flt.AddPartial(empty.Partial()).ok());
  EXPECT_EQ(flt.count(), 1u);
}

TEST(PartialSumTest, ExactSumIsMeanOnlyAndHoldsFourTimesTheModel) {
  StrategyOptions options;
  options.params.set_exact_sum(true);
  absl::StatusOr<Strategy> mean = MakeStrategy(options);
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(mean->RoundMemoryBytes(10, 1000), 4000u);
  options.kind = common::v1::AGGREGATION_MEDIAN;
  absl::StatusOr<Strategy> median = MakeStrategy(options);
  EXPECT_EQ(median.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(median.status().message(), HasSubstr("aggregation_options.exact_sum"));
}

}  // namespace
}  // namespace shoal::aggregation
