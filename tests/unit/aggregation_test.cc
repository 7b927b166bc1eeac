#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/aggregation/update_validation.h"
#include "libs/aggregation/weighted_mean.h"

namespace shoal::aggregation {
namespace {

using ::testing::HasSubstr;

tensor::ModelLayout Layout() { return *tensor::ModelLayout::Create({{"w", {2, 2}}, {"b", {2}}}); }

tensor::FlatModel ModelOf(std::vector<float> v) {
  tensor::FlatModel m;
  m.layout = Layout();
  m.values = std::move(v);
  return m;
}

TEST(WeightedMeanTest, ExactWeightedMean) {
  WeightedMeanAccumulator acc(Layout());
  std::vector<float> d1 = {1, 2, 3, 4, 5, 6};
  std::vector<float> d2 = {-2, 0, 6, 8, 2, 0};
  ASSERT_TRUE(acc.Add(d1, 1).ok());
  ASSERT_TRUE(acc.Add(d2, 3).ok());
  EXPECT_EQ(acc.count(), 2u);
  EXPECT_EQ(acc.total_weight(), 4);
  tensor::FlatModel base = ModelOf({10, 10, 10, 10, 10, 10});
  auto out = acc.Apply(base);
  ASSERT_TRUE(out.ok());
  for (size_t i = 0; i < d1.size(); ++i) {
    EXPECT_FLOAT_EQ(out->values[i], 10 + (d1[i] * 1 + d2[i] * 3) / 4) << i;
  }
  auto mean = acc.MeanDelta();
  EXPECT_FLOAT_EQ(mean[0], (1 - 6) / 4.0f);
}

TEST(WeightedMeanTest, NoContributionsKeepsTheBase) {
  WeightedMeanAccumulator acc(Layout());
  tensor::FlatModel base = ModelOf({1, 2, 3, 4, 5, 6});
  auto out = acc.Apply(base);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->values, base.values);
}

TEST(WeightedMeanTest, ResetForgetsContributions) {
  WeightedMeanAccumulator acc(Layout());
  ASSERT_TRUE(acc.Add(std::vector<float>{1, 1, 1, 1, 1, 1}, 2).ok());
  acc.Reset();
  ASSERT_TRUE(acc.Add(std::vector<float>{3, 3, 3, 3, 3, 3}, 1).ok());
  auto out = acc.Apply(ModelOf({0, 0, 0, 0, 0, 0}));
  EXPECT_FLOAT_EQ(out->values[0], 3);
}

TEST(WeightedMeanTest, RejectsBadInput) {
  WeightedMeanAccumulator acc(Layout());
  EXPECT_EQ(acc.Add(std::vector<float>{1, 2}, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(std::vector<float>(6, 1), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(std::vector<float>(6, 1), -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(std::vector<float>(6, 1), std::nan("")).code(),
            absl::StatusCode::kInvalidArgument);
  tensor::FlatModel other;
  other.layout = *tensor::ModelLayout::Create({{"x", {6}}});
  other.values.assign(6, 0);
  EXPECT_EQ(acc.Apply(other).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.count(), 0u);
}

TEST(UpdateValidationTest, Finite) {
  EXPECT_TRUE(CheckFinite(ModelOf({1, 2, 3, 4, 5, 6})).ok());
  auto s = CheckFinite(ModelOf({1, 2, 3, 4, 5, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'b'"));
  EXPECT_THAT(s.message(), HasSubstr("element 1"));
}

// The difference and its norm in one pass: the values x - base, and L2Norm of them bit for bit,
// with a tail after the 8-value lanes.
TEST(UpdateValidationTest, DifferenceNormIsTheNormOfTheDifference) {
  std::vector<float> x(1003), base(1003), out(1003);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(static_cast<float>(i)) * 3.0f;
    base[i] = std::cos(static_cast<float>(i) * 0.7f);
  }
  const double norm = DifferenceL2Norm(x, base, absl::MakeSpan(out));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], x[i] - base[i]) << i;
  EXPECT_EQ(norm, L2Norm(out));
  EXPECT_GT(norm, 0);
}

TEST(UpdateValidationTest, Norm) {
  EXPECT_DOUBLE_EQ(L2Norm(std::vector<float>{3, 4}), 5);
  std::vector<float> many(1001, 1.0f);
  EXPECT_NEAR(L2Norm(many), std::sqrt(1001.0), 1e-9);
  EXPECT_TRUE(CheckNormBound(5, 0).ok());
  EXPECT_TRUE(CheckNormBound(5, 5).ok());
  auto s = CheckNormBound(5.5, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("norm"));
  EXPECT_FALSE(CheckNormBound(std::nan(""), 5).ok());
}

TEST(UpdateValidationTest, Layout) {
  EXPECT_TRUE(CheckLayout(ModelOf({1, 2, 3, 4, 5, 6}), Layout()).ok());
  tensor::FlatModel other;
  other.layout = *tensor::ModelLayout::Create({{"w", {4}}, {"b", {2}}});
  other.values.assign(6, 0);
  auto s = CheckLayout(other, Layout());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  tensor::FlatModel short_values = ModelOf({1, 2});
  EXPECT_EQ(CheckLayout(short_values, Layout()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::aggregation

namespace shoal::aggregation {
namespace {

TEST(WeightedMeanTest, ThreadedPassesMatchTheSingleThreadedOnes) {
  const int64_t n = (int64_t{1} << 23) + 12345;  // large enough to be split
  auto layout = *tensor::ModelLayout::Create({{"w", {n}}});
  std::vector<float> d1(n), d2(n);
  for (int64_t i = 0; i < n; ++i) {
    d1[i] = static_cast<float>(i % 101) * 0.01f;
    d2[i] = static_cast<float>(i % 37) * -0.1f;
  }
  tensor::FlatModel base;
  base.layout = layout;
  base.values.assign(n, 1.0f);
  WeightedMeanAccumulator one(layout, 1), two(layout, 2);
  for (auto* acc : {&one, &two}) {
    ASSERT_TRUE(acc->Add(d1, 2).ok());
    ASSERT_TRUE(acc->Add(d2, 5).ok());
  }
  auto a = one.Apply(base);
  auto b = two.Apply(base);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->values, b->values);
}

// AddTaking and ApplyInPlace give the bits Add and ApplyInto give, and move the buffers as
// documented: the first term's buffer becomes the sum, and the sum's buffer the result, so a
// round holds no model-sized buffer of its own.
TEST(WeightedMeanTest, TakingTheBuffersGivesTheSameModel) {
  const std::vector<float> d1 = {0.1f, -2.5f, 3.3f, 1e-7f, 5, 6.25f};
  const std::vector<float> d2 = {-2, 0.7f, 6, 8.1f, 2, -1e6f};
  const tensor::FlatModel base = ModelOf({10, 0.3f, -7, 1e3f, 0, 2});
  WeightedMeanAccumulator copying(Layout());
  ASSERT_TRUE(copying.Add(d1, 3).ok());
  ASSERT_TRUE(copying.Add(d2, 7).ok());
  std::vector<float> expected;
  ASSERT_TRUE(copying.ApplyInto(base, expected).ok());

  WeightedMeanAccumulator taking(Layout());
  std::vector<float> first = d1;
  const float* first_buffer = first.data();
  ASSERT_TRUE(taking.AddTaking(first, 3).ok());
  EXPECT_EQ(first.capacity(), 0u) << "a new accumulator has no buffer to give back";
  std::vector<float> second = d2;
  ASSERT_TRUE(taking.AddTaking(second, 7).ok());
  EXPECT_EQ(second, d2) << "a later term is only read";
  std::vector<float> out = {42, 42};
  const float* old_out = out.data();
  ASSERT_TRUE(taking.ApplyInPlace(base, out).ok());
  EXPECT_EQ(out, expected);
  EXPECT_EQ(out.data(), first_buffer) << "the result is made in the first term's buffer";
  EXPECT_EQ(taking.count(), 0u);

  // The next sum starts in the buffer `out` had, and its first term gets that buffer back.
  std::vector<float> third = d2;
  const float* third_buffer = third.data();
  ASSERT_TRUE(taking.AddTaking(third, 1).ok());
  EXPECT_EQ(third.data(), old_out);
  std::vector<float> again;
  ASSERT_TRUE(taking.ApplyInPlace(base, again).ok());
  EXPECT_EQ(again.data(), third_buffer);
  for (size_t i = 0; i < d2.size(); ++i) EXPECT_FLOAT_EQ(again[i], base.values[i] + d2[i]) << i;

  // A refused first term changes nothing; with no terms the result is the base.
  std::vector<float> short_delta = {1, 2};
  EXPECT_EQ(taking.AddTaking(short_delta, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_delta.size(), 2u);
  std::vector<float> bad_weight(6, 1);
  EXPECT_EQ(taking.AddTaking(bad_weight, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_weight, std::vector<float>(6, 1));
  ASSERT_TRUE(taking.ApplyInPlace(base, out).ok());
  EXPECT_EQ(out, base.values);

  // Exact sums copy as before (their sum is not floats).
  WeightedMeanAccumulator exact(Layout(), 1, Summation::kExact);
  std::vector<float> e1 = d1;
  ASSERT_TRUE(exact.AddTaking(e1, 2).ok());
  EXPECT_EQ(e1, d1);
  std::vector<float> exact_out;
  ASSERT_TRUE(exact.ApplyInPlace(base, exact_out).ok());
  for (size_t i = 0; i < d1.size(); ++i) EXPECT_FLOAT_EQ(exact_out[i], base.values[i] + d1[i]);
  EXPECT_EQ(exact.count(), 0u);
}

}  // namespace
}  // namespace shoal::aggregation
