#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/fixed_point.h"

namespace shoal::privacy {
namespace {

using ::testing::HasSubstr;

std::vector<float> RandomValues(std::mt19937_64& rng, size_t count, double range) {
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<float> v(count);
  for (float& x : v) x = static_cast<float>(u(rng));
  return v;
}

std::vector<uint32_t> RingSum(const std::vector<std::vector<uint32_t>>& encodings, uint32_t mask) {
  std::vector<uint32_t> sum(encodings[0].size(), 0);
  for (const auto& e : encodings) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = (sum[i] + e[i]) & mask;
  }
  return sum;
}

TEST(FixedPointTest, ChoosesTheLargestPowerOfTwoScaleThatCannotWrap) {
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 100});
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ(codec->bits(), 32);
  // 100 · 2^24 ≤ 2^31 - 1 < 100 · 2^25.
  EXPECT_EQ(codec->scale(), 0x1p24);
  EXPECT_EQ(codec->quantum(), 0x1p-24);
  EXPECT_LE(codec->max_magnitude() * 100, (int64_t{1} << 31) - 1);
}

TEST(FixedPointTest, ChoosesTheSmallestRingForAGivenScale) {
  // 10 summands of ±4 at scale 256: |sum| ≤ 10240 < 2^15 - 1, not < 2^14 - 1.
  auto codec =
      FixedPointCodec::Create({.clip_range = 4.0, .max_summands = 10, .bits = 0, .scale = 256});
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ(codec->bits(), 15);
  EXPECT_EQ(codec->mask(), 0x7fffu);
}

TEST(FixedPointTest, RoundTripErrorIsHalfAQuantum) {
  auto codec = FixedPointCodec::Create({.clip_range = 2.5, .max_summands = 8});
  ASSERT_TRUE(codec.ok());
  std::mt19937_64 rng(1);
  std::vector<float> values = RandomValues(rng, 10000, 2.5);
  values.insert(values.end(), {2.5f, -2.5f, 0.0f, -0.0f, 1e-30f});
  auto encoded = codec->Encode(values);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  for (uint32_t e : *encoded) EXPECT_EQ(e & ~codec->mask(), 0u);
  auto decoded = codec->DecodeSum(*encoded, 1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_LE(std::abs((*decoded)[i] - values[i]), codec->quantum() / 2) << i;
  }
  EXPECT_EQ((*decoded)[values.size() - 5], 2.5);  // exactly representable at a 2^k scale
  EXPECT_EQ((*decoded)[values.size() - 4], -2.5);
}

TEST(FixedPointTest, SumOfNEncodingsDecodesToTheSumWithinNQuanta) {
  for (int bits : {32, 24, 16}) {
    for (int n : {1, 2, 5, 17, 64}) {
      SCOPED_TRACE(testing::Message() << bits << " bits, " << n << " summands");
      auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = n, .bits = bits});
      ASSERT_TRUE(codec.ok()) << codec.status();
      std::mt19937_64 rng(static_cast<uint64_t>(bits * 100 + n));
      const size_t count = 2000;
      std::vector<double> exact(count, 0.0);
      std::vector<std::vector<uint32_t>> encodings;
      for (int peer = 0; peer < n; ++peer) {
        std::vector<float> v = RandomValues(rng, count, 1.0);
        // Every peer at the edge of the range somewhere: the sum's extremes must not wrap.
        v[0] = 1.0f;
        v[1] = -1.0f;
        for (size_t i = 0; i < count; ++i) exact[i] += v[i];
        encodings.push_back(*codec->Encode(v));
      }
      auto decoded = codec->DecodeSum(RingSum(encodings, codec->mask()), n);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      for (size_t i = 0; i < count; ++i) {
        EXPECT_LE(std::abs((*decoded)[i] - exact[i]), n * codec->quantum()) << i;
      }
      EXPECT_EQ((*decoded)[0], n);
      EXPECT_EQ((*decoded)[1], -n);
    }
  }
}

TEST(FixedPointTest, StochasticRoundingIsSeededAndUnbiased) {
  // A coarse scale, so the rounding shows: 0.3 lies between 0 and one quantum (0.5).
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 4, .scale = 2});
  ASSERT_TRUE(codec.ok()) << codec.status();
  const std::vector<float> values(20000, 0.3f);
  auto a = codec->EncodeStochastic(values, 42);
  auto b = codec->EncodeStochastic(values, 42);
  auto c = codec->EncodeStochastic(values, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  auto decoded = codec->DecodeSum(*a, 1);
  ASSERT_TRUE(decoded.ok());
  double mean = 0;
  for (double d : *decoded) {
    EXPECT_TRUE(d == 0.0 || d == 0.5) << d;
    mean += d / static_cast<double>(values.size());
  }
  // Round to nearest would give 0.5 every time; stochastic rounding 0.3 on average
  // (standard error 0.0035).
  EXPECT_NEAR(mean, 0.3, 0.02);
  EXPECT_EQ((*codec->DecodeSum(*codec->Encode(values), 1))[0], 0.5);
}

TEST(FixedPointTest, RefusesValuesOutsideTheRangeOrNotFinite) {
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 3});
  ASSERT_TRUE(codec.ok());
  EXPECT_THAT(codec->Encode({0.5f, 1.001f}).status().message(),
              HasSubstr("value 1 (1.001) is outside [-1, 1]"));
  EXPECT_THAT(codec->Encode({-2.0f}).status().message(), HasSubstr("outside"));
  EXPECT_THAT(codec->Encode({std::numeric_limits<float>::quiet_NaN()}).status().message(),
              HasSubstr("value 0 is not finite"));
  EXPECT_THAT(
      codec->EncodeStochastic({std::numeric_limits<float>::infinity()}, 1).status().message(),
      HasSubstr("not finite"));
}

TEST(FixedPointTest, RefusesCombinationsThatCouldWrap) {
  // 2 summands of ±1 at scale 2^30 reach 2^31 > 2^31 - 1.
  EXPECT_THAT(
      FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 2, .bits = 32, .scale = 0x1p30})
          .status()
          .message(),
      HasSubstr("could wrap"));
  // ...and 1 summand fits exactly.
  EXPECT_TRUE(
      FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 1, .bits = 32, .scale = 0x1p30})
          .ok());
  EXPECT_THAT(
      FixedPointCodec::Create({.clip_range = 1e6, .max_summands = 1000, .bits = 0, .scale = 1e6})
          .status()
          .message(),
      HasSubstr("needs more than 32 bits"));
  EXPECT_THAT(FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 100000, .bits = 8})
                  .status()
                  .message(),
              HasSubstr("cannot hold the sum of 100000 values"));
  EXPECT_THAT(FixedPointCodec::Create({.clip_range = 0, .max_summands = 1}).status().message(),
              HasSubstr("clip_range"));
  EXPECT_THAT(FixedPointCodec::Create({.clip_range = 1, .max_summands = 0}).status().message(),
              HasSubstr("max_summands"));
  EXPECT_THAT(
      FixedPointCodec::Create({.clip_range = 1, .max_summands = 1, .bits = 33}).status().message(),
      HasSubstr("bits must be in [2, 32]"));
  EXPECT_THAT(
      FixedPointCodec::Create({.clip_range = 1, .max_summands = 1, .bits = 0}).status().message(),
      HasSubstr("needs a scale"));
  EXPECT_THAT(
      FixedPointCodec::Create({.clip_range = 1, .max_summands = 1, .scale = -1}).status().message(),
      HasSubstr("scale"));
}

TEST(FixedPointTest, DecodeRefusesWhatNoValidSumCouldBe) {
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 4, .bits = 16});
  ASSERT_TRUE(codec.ok());
  EXPECT_THAT(codec->DecodeSum({0}, 5).status().message(), HasSubstr("1 to 4"));
  EXPECT_THAT(codec->DecodeSum({0}, 0).status().message(), HasSubstr("1 to 4"));
  EXPECT_THAT(codec->DecodeSum({0x10000}, 1).status().message(), HasSubstr("not in Z_2^16"));
  // One encoding of 1.0 is max_magnitude; a value beyond it with summands = 1 (say, a mask
  // left in) is refused.
  const auto beyond = static_cast<uint32_t>(codec->max_magnitude() + 1);
  EXPECT_THAT(codec->DecodeSum({beyond}, 1).status().message(), HasSubstr("masks left in"));
  EXPECT_TRUE(codec->DecodeSum({beyond}, 2).ok());
}

TEST(FixedPointTest, EncodesAsLlroundTiesAwayFromZero) {
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 16, .bits = 32});
  ASSERT_TRUE(codec.ok());
  std::mt19937_64 rng(11);
  std::vector<float> values = RandomValues(rng, 20000, 1.0);
  // Ties (x · scale ending in .5), their neighbours one ulp either side, the ends and zero.
  for (double k : {0.0, 1.0, 2.0, 7.0, 12345.0, 100000.0}) {
    for (double sign : {1.0, -1.0}) {
      const auto tie = static_cast<float>(sign * (k + 0.5) / codec->scale());
      values.insert(values.end(), {tie, std::nextafter(tie, 0.0F), std::nextafter(tie, 2.0F)});
    }
  }
  values.insert(values.end(), {1.0F, -1.0F, 0.0F, -0.0F});
  auto encoded = codec->Encode(values);
  ASSERT_TRUE(encoded.ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t expected = std::llround(static_cast<double>(values[i]) * codec->scale());
    ASSERT_EQ((*encoded)[i], static_cast<uint32_t>(expected)) << "value " << values[i];
  }
}

TEST(FixedPointTest, DecodeAcceptsExactlyTheSumsWithinTheBound) {
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = 4, .bits = 16});
  ASSERT_TRUE(codec.ok());
  const int64_t bound = 2 * codec->max_magnitude();
  const auto at = [](int64_t v) { return static_cast<uint32_t>(v & 0xffff); };
  EXPECT_TRUE(codec->DecodeSum({at(bound), at(-bound), 0, at(-1)}, 2).ok());
  EXPECT_FALSE(codec->DecodeSum({at(bound + 1)}, 2).ok());
  EXPECT_FALSE(codec->DecodeSum({at(-bound - 1)}, 2).ok());
  auto decoded = codec->DecodeSum({at(-bound), at(-1)}, 2);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ((*decoded)[0], -static_cast<double>(bound) / codec->scale());
  EXPECT_EQ((*decoded)[1], -1 / codec->scale());
}

}  // namespace
}  // namespace shoal::privacy
