// Federated-async settings (libs/aggregation/async_spec.h): staleness weights, defaults and
// validation.

#include "libs/aggregation/async_spec.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::aggregation {
namespace {

using common::v1::AsyncSpec;
using ::testing::HasSubstr;

AsyncSpec Weighting(common::v1::StalenessWeighting w) {
  AsyncSpec spec;
  spec.set_staleness(w);
  return spec;
}

TEST(StalenessWeightTest, Constant) {
  const AsyncSpec spec = Weighting(common::v1::STALENESS_WEIGHTING_CONSTANT);
  for (uint64_t s : {0, 1, 7, 1000}) EXPECT_EQ(StalenessWeight(spec, s), 1.0) << s;
}

TEST(StalenessWeightTest, PolynomialDefaultsToTheInverse) {
  const AsyncSpec unset;  // polynomial with a = 1
  EXPECT_DOUBLE_EQ(StalenessWeight(unset, 0), 1.0);
  EXPECT_DOUBLE_EQ(StalenessWeight(unset, 3), 0.25);  // (1 + 3)^-1
  EXPECT_DOUBLE_EQ(StalenessWeight(unset, 8), 1.0 / 9);
  AsyncSpec root = Weighting(common::v1::STALENESS_WEIGHTING_POLYNOMIAL);
  root.set_staleness_a(0.5);
  EXPECT_DOUBLE_EQ(StalenessWeight(root, 3), 0.5);  // (1 + 3)^-0.5
  AsyncSpec cubic = Weighting(common::v1::STALENESS_WEIGHTING_POLYNOMIAL);
  cubic.set_staleness_a(2);
  EXPECT_DOUBLE_EQ(StalenessWeight(cubic, 1), 0.25);
  EXPECT_DOUBLE_EQ(StalenessWeight(cubic, 4), 1.0 / 25);
  cubic.set_staleness_a(0);
  EXPECT_DOUBLE_EQ(StalenessWeight(cubic, 9), 1.0);
}

TEST(StalenessWeightTest, HingeKeepsFullWeightUpToB) {
  AsyncSpec hinge = Weighting(common::v1::STALENESS_WEIGHTING_HINGE);  // a = 10, b = 4
  for (uint64_t s : {0, 1, 4}) EXPECT_DOUBLE_EQ(StalenessWeight(hinge, s), 1.0) << s;
  EXPECT_DOUBLE_EQ(StalenessWeight(hinge, 5), 1.0 / 11);  // 1 / (10 (5 - 4) + 1)
  EXPECT_DOUBLE_EQ(StalenessWeight(hinge, 6), 1.0 / 21);
  hinge.set_staleness_a(0.5);
  hinge.set_staleness_b(0);
  EXPECT_DOUBLE_EQ(StalenessWeight(hinge, 2), 0.5);  // 1 / (0.5 x 2 + 1)
}

TEST(StalenessWeightTest, NeverIncreasesWithStaleness) {
  for (auto w :
       {common::v1::STALENESS_WEIGHTING_CONSTANT, common::v1::STALENESS_WEIGHTING_POLYNOMIAL,
        common::v1::STALENESS_WEIGHTING_HINGE}) {
    const AsyncSpec spec = Weighting(w);
    double previous = 1.0;
    for (uint64_t s = 0; s < 50; ++s) {
      const double weight = StalenessWeight(spec, s);
      EXPECT_GT(weight, 0.0);
      EXPECT_LE(weight, previous) << s;
      previous = weight;
    }
  }
}

TEST(AsyncDefaultsTest, FillsEveryUnsetField) {
  AsyncSpec spec;
  ApplyAsyncDefaults(spec, 3);
  EXPECT_EQ(spec.buffer_size(), 3u);
  EXPECT_EQ(spec.max_staleness(), 4u);
  EXPECT_EQ(spec.staleness(), common::v1::STALENESS_WEIGHTING_POLYNOMIAL);
  EXPECT_DOUBLE_EQ(spec.staleness_a(), 1);
  EXPECT_FALSE(spec.has_staleness_b());
  const AsyncSpec once = spec;
  ApplyAsyncDefaults(spec, 7);  // idempotent: set fields stay
  EXPECT_EQ(spec.SerializeAsString(), once.SerializeAsString());

  AsyncSpec hinge = Weighting(common::v1::STALENESS_WEIGHTING_HINGE);
  ApplyAsyncDefaults(hinge, 1);
  EXPECT_DOUBLE_EQ(hinge.staleness_a(), 10);
  EXPECT_EQ(hinge.staleness_b(), 4u);
  AsyncSpec constant = Weighting(common::v1::STALENESS_WEIGHTING_CONSTANT);
  ApplyAsyncDefaults(constant, 1);
  EXPECT_FALSE(constant.has_staleness_a());
  EXPECT_TRUE(ValidateAsyncSpec(constant, 0).ok());
}

TEST(AsyncValidationTest, NamesTheField) {
  struct Case {
    std::function<void(AsyncSpec&)> set;
    uint32_t max_participants;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](AsyncSpec& s) { s.set_buffer_size(0); }, 0, "async.buffer_size: must be >= 1, got 0"},
      {[](AsyncSpec& s) { s.set_buffer_size(5); }, 4,
       "async.buffer_size: must be at most max_participants (4): the buffer holds one update per "
       "peer, got 5"},
      {[](AsyncSpec& s) { s.set_staleness_a(-1); }, 0,
       "async.staleness_a: must be >= 0 and finite, got -1"},
      {[](AsyncSpec& s) { s.set_staleness_a(std::nan("")); }, 0, "async.staleness_a: must be"},
      {[](AsyncSpec& s) {
         s.set_staleness(common::v1::STALENESS_WEIGHTING_CONSTANT);
         s.set_staleness_a(1);
       },
       0, "async.staleness_a: used only by staleness polynomial or hinge"},
      {[](AsyncSpec& s) { s.set_staleness_b(2); }, 0,
       "async.staleness_b: used only by staleness hinge, but staleness is polynomial"},
      {[](AsyncSpec& s) { s.set_staleness(static_cast<common::v1::StalenessWeighting>(9)); }, 0,
       "async.staleness: unsupported value 9"},
  };
  for (const Case& c : cases) {
    AsyncSpec spec;
    c.set(spec);
    absl::Status s = ValidateAsyncSpec(spec, c.max_participants);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  AsyncSpec full;
  full.set_buffer_size(4);
  EXPECT_TRUE(ValidateAsyncSpec(full, 4).ok());
}

}  // namespace
}  // namespace shoal::aggregation
