#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/fixed_point.h"
#include "libs/privacy/masks.h"

namespace shoal::privacy {
namespace {

using ::testing::HasSubstr;

TEST(MasksTest, ExpansionIsTheChaCha20KeystreamAndDeterministic) {
  const std::string seed(kMaskSeedSize, '\x5a');
  auto mask = ExpandMask(seed, 1000, 32);
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_EQ(*mask, *ExpandMask(seed, 1000, 32));
  auto keystream = ChaCha20Keystream(seed, std::string(12, '\0'), 0, 4 * 1000);
  ASSERT_TRUE(keystream.ok());
  for (size_t i = 0; i < 1000; ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(keystream->data()) + 4 * i;
    EXPECT_EQ((*mask)[i], b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24);
  }
  // A shorter mask is a prefix; a smaller ring keeps the low bits.
  auto prefix = ExpandMask(seed, 10, 32);
  auto low = ExpandMask(seed, 10, 20);
  ASSERT_TRUE(prefix.ok() && low.ok());
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ((*prefix)[i], (*mask)[i]);
    EXPECT_EQ((*low)[i], (*mask)[i] & 0xfffffu);
  }
  EXPECT_NE(*mask, *ExpandMask(std::string(kMaskSeedSize, '\x5b'), 1000, 32));
}

// MaskStreams, fed in uneven pieces, adds and subtracts the masks ExpandMask gives (the keystream,
// checked above), reduced mod 2^bits.
TEST(MasksTest, StreamsInOnePassEqualMasksAppliedInTurn) {
  constexpr size_t kSize = 10007;
  for (int bits : {32, 20}) {
    SCOPED_TRACE(testing::Message() << bits << " bits");
    std::mt19937_64 rng(static_cast<uint64_t>(bits));
    std::vector<uint32_t> expected(kSize);
    for (uint32_t& v : expected) v = static_cast<uint32_t>(rng() & ((uint64_t{1} << bits) - 1));
    std::vector<uint32_t> values = expected;
    const uint32_t ring = static_cast<uint32_t>((uint64_t{1} << bits) - 1);
    auto streams = MaskStreams::Create(bits);
    ASSERT_TRUE(streams.ok());
    for (int k = 0; k < 5; ++k) {
      const std::string seed(kMaskSeedSize, static_cast<char>('a' + k));
      const MaskSign sign = k % 2 == 0 ? MaskSign::kAdd : MaskSign::kSubtract;
      auto mask = ExpandMask(seed, kSize, 32);
      ASSERT_TRUE(mask.ok());
      for (size_t i = 0; i < kSize; ++i) {
        expected[i] =
            (sign == MaskSign::kAdd ? expected[i] + (*mask)[i] : expected[i] - (*mask)[i]) & ring;
      }
      ASSERT_TRUE(streams->Add(seed, sign).ok());
    }
    for (size_t start = 0, piece = 1; start < kSize; start += piece, piece = piece * 3 + 1) {
      piece = std::min(piece, kSize - start);
      ASSERT_TRUE(streams->ApplyNext(absl::MakeSpan(values).subspan(start, piece)).ok());
    }
    EXPECT_EQ(values, expected);
  }
}

TEST(MasksTest, LowerIdAddsHigherSubtracts) {
  EXPECT_EQ(*PairwiseMaskSign("peer-1", "peer-2"), MaskSign::kAdd);
  EXPECT_EQ(*PairwiseMaskSign("peer-2", "peer-1"), MaskSign::kSubtract);
  // Byte-wise order: "peer-10" < "peer-9".
  EXPECT_EQ(*PairwiseMaskSign("peer-10", "peer-9"), MaskSign::kAdd);
  EXPECT_THAT(PairwiseMaskSign("peer-1", "peer-1").status().message(),
              HasSubstr("shares no mask with itself"));
}

// Five peers, each with an X25519 key pair; every pair derives its seed by key agreement, every
// peer masks its encoded update with a self mask and its four pairwise masks. The pairwise masks
// cancel in the sum mod 2^k exactly; removing the self masks leaves the sum of the encodings.
TEST(MasksTest, FivePeersPairwiseMasksCancelExactly) {
  constexpr int kPeers = 5;
  constexpr size_t kSize = 10007;  // not a multiple of the expansion block
  for (int bits : {32, 24}) {
    SCOPED_TRACE(testing::Message() << bits << " bits");
    auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = kPeers, .bits = bits});
    ASSERT_TRUE(codec.ok());
    std::mt19937_64 rng(static_cast<uint64_t>(bits));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<std::string> ids;
    std::vector<KeyPair> keys;
    for (int p = 0; p < kPeers; ++p) {
      ids.push_back("peer-" + std::to_string(p));
      keys.push_back(*GenerateX25519KeyPair());
    }
    std::vector<uint32_t> plain_sum(kSize, 0);
    std::vector<uint32_t> masked_sum(kSize, 0);
    std::vector<std::string> self_seeds;
    for (int p = 0; p < kPeers; ++p) {
      std::vector<float> update(kSize);
      for (float& x : update) x = u(rng);
      std::vector<uint32_t> input = *codec->Encode(update);
      ASSERT_TRUE(RingAdd(absl::MakeSpan(plain_sum), input, bits).ok());
      const std::vector<uint32_t> unmasked = input;
      self_seeds.push_back(*RandomBytes(kMaskSeedSize));
      ASSERT_TRUE(ApplyMask(absl::MakeSpan(input), self_seeds.back(), MaskSign::kAdd, bits).ok());
      for (int q = 0; q < kPeers; ++q) {
        if (q == p) continue;
        auto seed = DeriveSharedSeed(keys[p].private_key, keys[q].public_key, "round 1 pairwise");
        ASSERT_TRUE(seed.ok()) << seed.status();
        ASSERT_TRUE(
            ApplyMask(absl::MakeSpan(input), *seed, *PairwiseMaskSign(ids[p], ids[q]), bits).ok());
      }
      // A masked input says nothing obvious about the update: nearly every element moved.
      size_t same = 0;
      for (size_t i = 0; i < kSize; ++i) same += input[i] == unmasked[i];
      EXPECT_LT(same, 10u);
      for (uint32_t v : input) ASSERT_EQ(v & ~codec->mask(), 0u);
      ASSERT_TRUE(RingAdd(absl::MakeSpan(masked_sum), input, bits).ok());
    }
    // Only the self masks remain; the aggregator removes them with the reconstructed seeds.
    for (const std::string& seed : self_seeds) {
      ASSERT_TRUE(ApplyMask(absl::MakeSpan(masked_sum), seed, MaskSign::kSubtract, bits).ok());
    }
    EXPECT_EQ(masked_sum, plain_sum);
    auto decoded = codec->DecodeSum(masked_sum, kPeers);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
  }
}

TEST(MasksTest, ADroppedPeersPairwiseMasksAreRemovedFromItsSeeds) {
  // Peers 0..3 mask with each other and with peer 4, which then drops out before sending. The
  // survivors' sum still holds their masks with peer 4; recomputing those from the pairwise
  // seeds (SecAgg recovers peer 4's key from its Shamir shares) removes them.
  constexpr int kPeers = 5;
  constexpr int kDropped = 4;
  constexpr size_t kSize = 257;
  std::vector<KeyPair> keys;
  std::vector<std::string> ids;
  for (int p = 0; p < kPeers; ++p) {
    keys.push_back(*GenerateX25519KeyPair());
    ids.push_back("peer-" + std::to_string(p));
  }
  std::vector<uint32_t> sum(kSize, 0);
  std::vector<uint32_t> expected(kSize, 0);
  for (int p = 0; p < kPeers; ++p) {
    if (p == kDropped) continue;
    std::vector<uint32_t> input(kSize, static_cast<uint32_t>(p + 1));
    ASSERT_TRUE(RingAdd(absl::MakeSpan(expected), input, 32).ok());
    for (int q = 0; q < kPeers; ++q) {
      if (q == p) continue;
      const std::string seed = *DeriveSharedSeed(keys[p].private_key, keys[q].public_key, "r");
      ASSERT_TRUE(
          ApplyMask(absl::MakeSpan(input), seed, *PairwiseMaskSign(ids[p], ids[q]), 32).ok());
    }
    ASSERT_TRUE(RingAdd(absl::MakeSpan(sum), input, 32).ok());
  }
  EXPECT_NE(sum, expected);
  // The dropped peer's recovered private key gives each survivor's seed with it; undo the
  // survivor's mask with the opposite of the sign the survivor used.
  for (int p = 0; p < kPeers; ++p) {
    if (p == kDropped) continue;
    const std::string seed = *DeriveSharedSeed(keys[kDropped].private_key, keys[p].public_key, "r");
    const MaskSign used = *PairwiseMaskSign(ids[p], ids[kDropped]);
    ASSERT_TRUE(ApplyMask(absl::MakeSpan(sum), seed,
                          used == MaskSign::kAdd ? MaskSign::kSubtract : MaskSign::kAdd, 32)
                    .ok());
  }
  EXPECT_EQ(sum, expected);
}

TEST(MasksTest, RefusesBadArguments) {
  EXPECT_THAT(ExpandMask("short", 4, 32).status().message(),
              HasSubstr("mask seed must be 32 bytes, got 5"));
  EXPECT_THAT(ExpandMask(std::string(32, 's'), 4, 0).status().message(),
              HasSubstr("bits must be in [1, 32]"));
  std::vector<uint32_t> a(3), b(4);
  EXPECT_THAT(RingAdd(absl::MakeSpan(a), b, 32).message(), HasSubstr("3 elements, input has 4"));
  EXPECT_FALSE(ApplyMask(absl::MakeSpan(a), "short", MaskSign::kAdd, 32).ok());
}

}  // namespace
}  // namespace shoal::privacy
