// The fixed-point encoding of federation-statistics moments for secure aggregation
// (libs/privacy/moments_codec.h): a peer's moments round-trip within half a quantum, the ring sum
// of several peers' encodings decodes to their pooled moments within the encoding's resolution,
// moments beyond the declared bound are refused naming the feature, and the largest sums the
// codec allows do not wrap.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "libs/privacy/moments_codec.h"

namespace shoal::privacy {
namespace {

using ::testing::HasSubstr;

data::FeatureMoments Moments(uint64_t count, std::vector<double> sum,
                             std::vector<double> sum_squares) {
  data::FeatureMoments m;
  m.count = count;
  m.sum = std::move(sum);
  m.sum_squares = std::move(sum_squares);
  return m;
}

std::vector<uint32_t> RingSum(const std::vector<std::vector<uint32_t>>& encodings) {
  std::vector<uint32_t> sum(encodings.front().size(), 0);
  for (const auto& e : encodings) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += e[i];  // mod 2^32, as the masks add
  }
  return sum;
}

TEST(MomentsCodecTest, OnePeerRoundTripsWithinHalfAQuantum) {
  auto codec = MomentsCodec::Create(2, 100);
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ(codec->length(), 6u * 5);
  EXPECT_EQ(codec->sum_quantum(), std::ldexp(128.0, -46));  // B' = 128
  EXPECT_EQ(codec->square_quantum(), std::ldexp(128.0 * 128.0, -46));
  const data::FeatureMoments m = Moments(3, {-12.345678901, 250.5}, {101.25, 21000.0 / 3});
  auto encoded = codec->Encode(m);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  for (uint32_t e : *encoded) EXPECT_LE(e, 0xffffu);
  auto decoded = codec->DecodeSum(*encoded, 1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->count, 3u);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_NEAR(decoded->sum[j], m.sum[j], codec->sum_quantum() / 2) << j;
    EXPECT_NEAR(decoded->sum_squares[j], m.sum_squares[j], codec->square_quantum() / 2) << j;
  }
}

TEST(MomentsCodecTest, TheRingSumOfPeersDecodesToTheirPooledMoments) {
  auto codec = MomentsCodec::Create(3, 10);
  ASSERT_TRUE(codec.ok());
  const std::vector<data::FeatureMoments> peers = {
      Moments(4, {-7.5, 1.25, 0}, {30.1, 2.2, 0}),
      Moments(1000, {-2500.0, 3333.3333, 1e-9}, {9000, 11111.1, 1e-12}),
      Moments(7, {69.99, -0.001, -3}, {699.9, 1e-6, 2.5})};
  std::vector<std::vector<uint32_t>> encodings;
  data::FeatureMoments pooled;
  for (const auto& p : peers) {
    auto e = codec->Encode(p);
    ASSERT_TRUE(e.ok()) << e.status();
    encodings.push_back(*e);
    ASSERT_TRUE(data::AddMoments(pooled, p).ok());
  }
  auto total = codec->DecodeSum(RingSum(encodings), 3);
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(total->count, 1011u);
  // Within 3 half quanta, and the rounding of the plain double sums themselves.
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_NEAR(total->sum[j], pooled.sum[j],
                3 * codec->sum_quantum() / 2 + 1e-15 * std::abs(pooled.sum[j]))
        << j;
    EXPECT_NEAR(total->sum_squares[j], pooled.sum_squares[j],
                3 * codec->square_quantum() / 2 + 1e-15 * pooled.sum_squares[j])
        << j;
  }
}

TEST(MomentsCodecTest, MomentsBeyondTheBoundAreRefusedNamingTheFeature) {
  auto codec = MomentsCodec::Create(2, 10);
  ASSERT_TRUE(codec.ok());
  // Feature 1's values reach 11 > 10: its mean square is 121.
  auto s = codec->Encode(Moments(2, {0, 22}, {0, 242})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("feature 1 has values beyond "
                                     "privacy.secure_aggregation.feature_bound 10"));
  const std::vector<std::string> names = {"rpm", "temperature"};
  s = codec->Encode(Moments(1, {-10.5, 0}, {100, 0}), names).status();
  EXPECT_THAT(s.message(), HasSubstr("feature 0 (rpm) has values beyond"));
  // Exactly at the bound is fine.
  EXPECT_TRUE(codec->Encode(Moments(2, {-20, 20}, {200, 200})).ok());
  // Malformed moments, another number of features, too many samples.
  EXPECT_THAT(codec->Encode(Moments(0, {0, 0}, {0, 0})).status().message(),
              HasSubstr("count must be > 0"));
  EXPECT_THAT(codec->Encode(Moments(1, {NAN, 0}, {0, 0})).status().message(),
              HasSubstr("feature 0: sum nan"));
  EXPECT_THAT(codec->Encode(Moments(1, {0}, {0})).status().message(),
              HasSubstr("1 features, the encoding is for 2"));
  EXPECT_THAT(codec->Encode(Moments(kMaxMomentsCount + 1, {0, 0}, {0, 0})).status().message(),
              HasSubstr("over the limit"));
  // Bad codecs.
  EXPECT_THAT(MomentsCodec::Create(0, 1).status().message(), HasSubstr("0 features"));
  EXPECT_THAT(MomentsCodec::Create(1, 0).status().message(), HasSubstr("feature_bound"));
  EXPECT_THAT(MomentsCodec::Create(1, INFINITY).status().message(), HasSubstr("feature_bound"));
}

TEST(MomentsCodecTest, TheLargestAllowedSumDoesNotWrap) {
  const double bound = 1000;
  auto codec = MomentsCodec::Create(1, bound);
  ASSERT_TRUE(codec.ok());
  // kMaxMomentsPeers peers, each with kMaxMomentsCount samples all at -bound: every limb's ring
  // sum is kMaxMomentsPeers times the limb, below 2^32.
  const double n = static_cast<double>(kMaxMomentsCount);
  auto one = codec->Encode(Moments(kMaxMomentsCount, {-n * bound}, {n * bound * bound}));
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<uint32_t> sum(*one);
  for (uint32_t& e : sum) e *= static_cast<uint32_t>(kMaxMomentsPeers);
  auto total = codec->DecodeSum(sum, kMaxMomentsPeers);
  ASSERT_TRUE(total.ok()) << total.status();
  const double peers = kMaxMomentsPeers;
  EXPECT_EQ(total->count, static_cast<uint64_t>(peers * n));
  EXPECT_DOUBLE_EQ(total->sum[0], -peers * n * bound);
  EXPECT_DOUBLE_EQ(total->sum_squares[0], peers * n * bound * bound);
}

TEST(MomentsCodecTest, ASumWithMasksLeftInItIsRefused) {
  auto codec = MomentsCodec::Create(1, 1);
  ASSERT_TRUE(codec.ok());
  auto e = codec->Encode(Moments(5, {2.5}, {1.5}));
  ASSERT_TRUE(e.ok());
  std::vector<uint32_t> masked = *e;
  masked[2] += 0x9e3779b9u;  // what a mask that was not removed looks like
  auto s = codec->DecodeSum(masked, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("masks left in it"));
  EXPECT_THAT(codec->DecodeSum(*e, 0).status().message(), HasSubstr("0 summands"));
  EXPECT_THAT(codec->DecodeSum(std::vector<uint32_t>(3), 1).status().message(),
              HasSubstr("3 ring elements"));
}

}  // namespace
}  // namespace shoal::privacy
