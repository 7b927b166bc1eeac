#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/shamir.h"

namespace shoal::privacy {
namespace {

using ::testing::HasSubstr;

std::string RandomSecret(std::mt19937_64& rng, size_t size) {
  std::string s(size, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// `count` distinct shares of `shares`, picked by `rng`.
std::vector<ShamirShare> Pick(const std::vector<ShamirShare>& shares, size_t count,
                              std::mt19937_64& rng) {
  std::vector<ShamirShare> copy = shares;
  std::shuffle(copy.begin(), copy.end(), rng);
  copy.resize(count);
  return copy;
}

TEST(ShamirTest, AnyThresholdSubsetReconstructs) {
  const std::string secret = "a 32-byte seed for the self mask";
  ASSERT_EQ(secret.size(), 32u);
  auto shares = ShamirSplit(secret, 3, 5);
  ASSERT_TRUE(shares.ok()) << shares.status();
  ASSERT_EQ(shares->size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ((*shares)[i].index, i + 1);
    EXPECT_EQ((*shares)[i].values.size(), 5u);  // ceil(32 / 7)
  }
  // Every 3-subset of the 5, in every order it comes in.
  for (int a = 0; a < 5; ++a) {
    for (int b = 0; b < 5; ++b) {
      for (int c = 0; c < 5; ++c) {
        if (a == b || b == c || a == c) continue;
        const std::vector<ShamirShare> subset = {(*shares)[a], (*shares)[b], (*shares)[c]};
        auto got = ShamirCombine(subset, 3);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, secret) << a << b << c;
      }
    }
  }
  // All five, the extra two checked against the first three.
  EXPECT_EQ(*ShamirCombine(*shares, 3), secret);
}

TEST(ShamirTest, FewerThanThresholdSharesDoNotGiveTheSecret) {
  std::mt19937_64 rng(7);
  const std::string secret = RandomSecret(rng, 32);
  auto shares = ShamirSplit(secret, 4, 6);
  ASSERT_TRUE(shares.ok());
  const std::vector<ShamirShare> three = Pick(*shares, 3, rng);
  EXPECT_THAT(ShamirCombine(three, 4).status().message(), HasSubstr("3 shares cannot"));
  // Interpolating t - 1 shares as if they were enough yields a polynomial of too low a degree:
  // either no valid secret at all or a different one.
  auto wrong = ShamirCombine(three, 3);
  EXPECT_TRUE(!wrong.ok() || *wrong != secret);
}

TEST(ShamirTest, SharesOfOneSecretDifferEachTime) {
  const std::string secret(32, 'k');
  auto a = ShamirSplit(secret, 2, 3);
  auto b = ShamirSplit(secret, 2, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  // Fresh random coefficients: a single share says nothing, and two splits do not match.
  EXPECT_NE((*a)[0].values, (*b)[0].values);
  EXPECT_EQ(*ShamirCombine(*a, 2), secret);
  EXPECT_EQ(*ShamirCombine(*b, 2), secret);
}

TEST(ShamirTest, RandomSplitsReconstructFromRandomSubsets) {
  std::mt19937_64 rng(20240601);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t size = 1 + rng() % 80;
    const int n = 2 + static_cast<int>(rng() % 30);
    const int t = 2 + static_cast<int>(rng() % static_cast<uint64_t>(n - 1));
    SCOPED_TRACE(testing::Message()
                 << "trial " << trial << ": " << t << " of " << n << ", " << size << " bytes");
    const std::string secret = RandomSecret(rng, size);
    auto shares = ShamirSplit(secret, t, n);
    ASSERT_TRUE(shares.ok()) << shares.status();
    const size_t count = static_cast<size_t>(t) + rng() % static_cast<uint64_t>(n - t + 1);
    auto got = ShamirCombine(Pick(*shares, count, rng), t);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, secret);
    if (t > 2) {
      auto short_one = ShamirCombine(Pick(*shares, static_cast<size_t>(t) - 1, rng), t - 1);
      EXPECT_TRUE(!short_one.ok() || *short_one != secret);
    }
  }
}

TEST(ShamirTest, SerializedSharesRoundTrip) {
  auto shares = ShamirSplit("seed bytes", 2, 3);
  ASSERT_TRUE(shares.ok());
  std::vector<ShamirShare> parsed;
  for (const ShamirShare& share : *shares) {
    const std::string bytes = SerializeShamirShare(share);
    EXPECT_EQ(bytes.size(), 8u + 8 * 2);
    auto back = ParseShamirShare(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->index, share.index);
    EXPECT_EQ(back->values, share.values);
    parsed.push_back(*back);
  }
  EXPECT_EQ(*ShamirCombine(parsed, 2), "seed bytes");
  const std::string bytes = SerializeShamirShare((*shares)[0]);
  EXPECT_THAT(ParseShamirShare(bytes.substr(0, 20)).status().message(), HasSubstr("20 bytes"));
  EXPECT_THAT(ParseShamirShare("abc").status().message(), HasSubstr("header"));
  std::string outside = bytes;
  for (size_t i = 8; i < 16; ++i) outside[i] = '\xff';
  EXPECT_THAT(ParseShamirShare(outside).status().message(), HasSubstr("outside the field"));
}

TEST(ShamirTest, ACorruptedExtraShareIsCaught) {
  const std::string secret(32, 's');
  auto shares = ShamirSplit(secret, 3, 5);
  ASSERT_TRUE(shares.ok());
  std::vector<ShamirShare> tampered = *shares;
  tampered[4].values[2] = (tampered[4].values[2] + 1) % kShamirPrime;
  EXPECT_THAT(ShamirCombine(tampered, 3).status().message(), HasSubstr("share 5 does not agree"));
  // Among the first t, a corrupted share changes the result; the check on 0's range catches it
  // with probability 31/32 per chunk, and the extra shares always.
  std::vector<ShamirShare> first = {tampered[4], tampered[0], tampered[1]};
  auto got = ShamirCombine(first, 3);
  EXPECT_TRUE(!got.ok() || *got != secret);
}

TEST(ShamirTest, RefusesBadArgumentsNamingThem) {
  EXPECT_THAT(ShamirSplit("", 2, 3).status().message(), HasSubstr("1 to 65536 bytes"));
  EXPECT_THAT(ShamirSplit("s", 1, 3).status().message(), HasSubstr("at least 2"));
  EXPECT_THAT(ShamirSplit("s", 0, 3).status().message(), HasSubstr("at least 2"));
  EXPECT_THAT(ShamirSplit("s", 4, 3).status().message(), HasSubstr("[threshold 4"));
  EXPECT_THAT(ShamirSplit("s", 2, 70000).status().message(), HasSubstr("65535"));

  auto shares = ShamirSplit("0123456789abcdef", 2, 4);
  ASSERT_TRUE(shares.ok());
  std::vector<ShamirShare> duplicate = {(*shares)[1], (*shares)[1]};
  EXPECT_THAT(ShamirCombine(duplicate, 2).status().message(), HasSubstr("given twice"));
  std::vector<ShamirShare> zero = {(*shares)[0], (*shares)[1]};
  zero[0].index = 0;
  EXPECT_THAT(ShamirCombine(zero, 2).status().message(), HasSubstr("index 0"));
  auto other = ShamirSplit("a longer secret of 31 bytes....", 2, 4);
  ASSERT_TRUE(other.ok());
  std::vector<ShamirShare> mixed = {(*shares)[0], (*other)[1]};
  EXPECT_THAT(ShamirCombine(mixed, 2).status().message(), HasSubstr("31-byte secret"));
  std::vector<ShamirShare> truncated = {(*shares)[0], (*shares)[1]};
  truncated[1].values.pop_back();
  EXPECT_THAT(ShamirCombine(truncated, 2).status().message(), HasSubstr("has 2 values"));
  EXPECT_THAT(ShamirCombine(*shares, 1).status().message(), HasSubstr("at least 2"));
  std::vector<ShamirShare> out_of_field = {(*shares)[0], (*shares)[1]};
  out_of_field[0].values[0] = kShamirPrime;
  EXPECT_THAT(ShamirCombine(out_of_field, 2).status().message(), HasSubstr("outside the field"));
}

}  // namespace
}  // namespace shoal::privacy
