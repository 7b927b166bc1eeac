// Pairwise double masking among peers that exchange updates directly
// (libs/privacy/secagg/pairwise_round.h): the masks cancel, a participant that drops after
// masking is recovered from the survivors' reveals, and no participant reveals both kinds of
// seed for one peer.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/fixed_point.h"
#include "libs/privacy/masks.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/pairwise_round.h"
#include "libs/privacy/secagg/update_codec.h"

namespace shoal::privacy::secagg {
namespace {

using ::testing::HasSubstr;

constexpr size_t kSize = 4099;  // not a multiple of the expansion block
constexpr char kRound[] = "task-a/3";

// N participants with identity keys, mask keys and clipped, encoded updates.
struct Round {
  std::vector<std::string> ids;
  std::vector<std::unique_ptr<Ed25519KeySigner>> signers;
  std::unique_ptr<Ed25519KeyVerifier> verifier;
  std::vector<PairwiseMasker> maskers;
  std::map<std::string, MaskKey> keys;
  FixedPointCodec codec;
  std::vector<std::vector<float>> updates;
  std::vector<std::vector<uint32_t>> encoded;
};

Round MakeRound(int n, uint64_t seed) {
  std::vector<std::string> ids;
  std::vector<std::unique_ptr<Ed25519KeySigner>> signers;
  std::map<std::string, std::string> identity_keys;
  for (int i = 0; i < n; ++i) {
    ids.push_back("peer-" + std::to_string(i));
    KeyPair identity = *GenerateEd25519KeyPair();
    signers.push_back(*Ed25519KeySigner::Create(identity.private_key));
    identity_keys[ids.back()] = identity.public_key;
  }
  Round r{ids,
          std::move(signers),
          *Ed25519KeyVerifier::Create(identity_keys),
          {},
          {},
          *UpdateCodec(1.0, n, 0),
          {},
          {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.01f);  // L2 norm ~0.64: not clipped
  for (int i = 0; i < n; ++i) {
    r.maskers.push_back(*PairwiseMasker::Create(kRound, ids[i]));
    r.keys[ids[i]] = *r.maskers.back().Advertise(*r.signers[i]);
    std::vector<float> update(kSize);
    for (float& x : update) x = normal(rng);
    r.encoded.push_back(*ClipAndEncode(r.codec, update));
    r.updates.push_back(std::move(update));
  }
  return r;
}

std::vector<std::vector<uint32_t>> MaskAll(Round& r, uint32_t attempt) {
  std::vector<std::vector<uint32_t>> masked;
  for (size_t i = 0; i < r.ids.size(); ++i) {
    auto y = r.maskers[i].Mask(attempt, r.keys, *r.verifier, r.encoded[i], r.codec.bits());
    EXPECT_TRUE(y.ok()) << y.status();
    masked.push_back(y.ok() ? *y : std::vector<uint32_t>());
  }
  return masked;
}

std::vector<uint32_t> PlainSum(const Round& r, const std::vector<size_t>& who) {
  std::vector<uint32_t> sum(kSize, 0);
  for (size_t i : who) EXPECT_TRUE(RingAdd(absl::MakeSpan(sum), r.encoded[i], r.codec.bits()).ok());
  return sum;
}

// Every survivor's masked update and reveal into a MaskedSum, in the order given.
absl::StatusOr<std::vector<uint32_t>> Unmasked(Round& r, uint32_t attempt,
                                               const std::vector<std::vector<uint32_t>>& masked,
                                               const std::vector<size_t>& order) {
  std::vector<std::string> survivors;
  for (size_t i : order) survivors.push_back(r.ids[i]);
  auto sum = MaskedSum::Start(r.ids, survivors, kSize, r.codec.bits());
  if (!sum.ok()) return sum.status();
  for (size_t i : order) {
    if (absl::Status s = sum->AddMasked(r.ids[i], masked[i]); !s.ok()) return s;
    absl::StatusOr<MaskReveal> reveal = r.maskers[i].Reveal(attempt, survivors);
    if (!reveal.ok()) return reveal.status();
    if (absl::Status s = sum->Unmask(r.ids[i], *reveal); !s.ok()) return s;
  }
  EXPECT_TRUE(sum->complete());
  return sum->Finish();
}

TEST(PairwiseRoundTest, MasksCancelAndEveryOrderGivesTheSameBits) {
  Round r = MakeRound(4, 1);
  const auto masked = MaskAll(r, 0);
  for (size_t i = 0; i < masked.size(); ++i) {
    size_t same = 0;
    for (size_t k = 0; k < kSize; ++k) same += masked[i][k] == r.encoded[i][k];
    EXPECT_LT(same, kSize / 100) << "the masked update of " << r.ids[i] << " is not masked";
  }
  auto sum = Unmasked(r, 0, masked, {0, 1, 2, 3});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, PlainSum(r, {0, 1, 2, 3}));
  // Another participant, folding in another order, gets the same bits (Reveal repeats the same
  // seeds for the same survivors).
  auto again = Unmasked(r, 0, masked, {3, 1, 0, 2});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *sum);
  // The mean decodes to within the codec's quantum of the float mean.
  const std::vector<float> base(kSize, 0.5f);
  auto mean = ApplyMeanOfSum(r.codec, *sum, 4, base);
  ASSERT_TRUE(mean.ok()) << mean.status();
  for (size_t k = 0; k < kSize; ++k) {
    const double want = 0.5 + (static_cast<double>(r.updates[0][k]) + r.updates[1][k] +
                               r.updates[2][k] + r.updates[3][k]) /
                                  4;
    EXPECT_NEAR((*mean)[k], want, r.codec.quantum() + 1e-7) << k;
  }
}

TEST(PairwiseRoundTest, AParticipantThatDropsAfterMaskingIsRemovedByTheSurvivors) {
  Round r = MakeRound(5, 2);
  const auto masked = MaskAll(r, 2);
  // peer-2 is gone after serving its masked update: the survivors reveal their seeds with it.
  const std::vector<size_t> survivors = {4, 0, 3, 1};
  auto sum = Unmasked(r, 2, masked, survivors);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, PlainSum(r, {0, 1, 3, 4}));
  // Each reveal holds its self seed and exactly the seed with peer-2.
  auto reveal = r.maskers[0].Reveal(2, {"peer-0", "peer-1", "peer-3", "peer-4"});
  ASSERT_TRUE(reveal.ok());
  ASSERT_EQ(reveal->pair_seeds.size(), 1u);
  EXPECT_EQ(reveal->pair_seeds.begin()->first, "peer-2");
}

TEST(PairwiseRoundTest, OneMaskedUpdateWithItsRevealsStaysMasked) {
  // What a curious survivor holds of peer-0: its masked update, its self seed, its seed with the
  // dropped peer-3 and (its own) seed with peer-1; the mask shared with peer-2 remains.
  Round r = MakeRound(4, 3);
  const auto masked = MaskAll(r, 0);
  const std::vector<std::string> survivors = {"peer-0", "peer-1", "peer-2"};
  auto reveal = r.maskers[0].Reveal(0, survivors);
  ASSERT_TRUE(reveal.ok()) << reveal.status();
  std::vector<uint32_t> y = masked[0];
  ASSERT_TRUE(ApplyMask(absl::MakeSpan(y), reveal->self_seed, MaskSign::kSubtract, 32).ok());
  ASSERT_TRUE(
      ApplyMask(absl::MakeSpan(y), reveal->pair_seeds.at("peer-3"), MaskSign::kSubtract, 32).ok());
  size_t same = 0;
  for (size_t k = 0; k < kSize; ++k) same += y[k] == r.encoded[0][k];
  EXPECT_LT(same, kSize / 100);
}

TEST(PairwiseRoundTest, NoParticipantRevealsBothKindsOfSeedForOnePeer) {
  Round r = MakeRound(4, 4);
  MaskAll(r, 1);
  // Told it is not in S: its self seed stays secret.
  EXPECT_EQ(r.maskers[3].Reveal(1, {"peer-0", "peer-1", "peer-2"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // peer-0 revealed for S = {0, 1, 2, 3}: it never reveals its seed with peer-3 afterwards
  // (peer-3's self seed may be out), nor its self seed for another S.
  ASSERT_TRUE(r.maskers[0].Reveal(1, {"peer-0", "peer-1", "peer-2", "peer-3"}).ok());
  auto later = r.maskers[0].Reveal(1, {"peer-0", "peer-1", "peer-2"});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(later.status().message(), HasSubstr("reveals for no other set"));
  // The same S again is fine (a second fetch of the reveal).
  EXPECT_TRUE(r.maskers[0].Reveal(1, {"peer-3", "peer-2", "peer-1", "peer-0"}).ok());
  // Nor does it mask again once it revealed; and it reveals for no other attempt.
  EXPECT_EQ(r.maskers[0].Mask(2, r.keys, *r.verifier, r.encoded[0], 32).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.maskers[1].Reveal(0, {"peer-0", "peer-1"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.maskers[1].Reveal(1, {"peer-1", "peer-9"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PairwiseRoundTest, AMaskingAtALaterAttemptUsesFreshSeedsAndStillCancels) {
  Round r = MakeRound(4, 5);
  const auto first = MaskAll(r, 0);
  // peer-3 was unreachable: the other three mask again over the new list.
  r.keys.erase("peer-3");
  std::vector<std::vector<uint32_t>> second;
  for (size_t i = 0; i < 3; ++i) {
    auto y = r.maskers[i].Mask(1, r.keys, *r.verifier, r.encoded[i], 32);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_NE(*y, first[i]);
    second.push_back(*y);
  }
  auto sum =
      MaskedSum::Start({"peer-0", "peer-1", "peer-2"}, {"peer-0", "peer-1", "peer-2"}, kSize, 32);
  ASSERT_TRUE(sum.ok());
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(sum->AddMasked(r.ids[i], second[i]).ok());
    ASSERT_TRUE(
        sum->Unmask(r.ids[i], *r.maskers[i].Reveal(1, {"peer-0", "peer-1", "peer-2"})).ok());
  }
  EXPECT_EQ(*sum->Finish(), PlainSum(r, {0, 1, 2}));
}

TEST(PairwiseRoundTest, SubstitutedKeysAreRefused) {
  Round r = MakeRound(3, 6);
  // peer-1's key replaced by one an attacker signed with its own identity key.
  PairwiseMasker attacker = *PairwiseMasker::Create(kRound, "peer-1");
  KeyPair attacker_identity = *GenerateEd25519KeyPair();
  auto keys = r.keys;
  keys["peer-1"] = *attacker.Advertise(**Ed25519KeySigner::Create(attacker_identity.private_key));
  auto y = r.maskers[0].Mask(0, keys, *r.verifier, r.encoded[0], 32);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(y.status().message(), HasSubstr("peer-1"));
  // A key signed for another round does not verify either.
  PairwiseMasker other_round = *PairwiseMasker::Create("task-a/4", "peer-2");
  keys = r.keys;
  keys["peer-2"] = *other_round.Advertise(*r.signers[2]);
  EXPECT_EQ(r.maskers[0].Mask(0, keys, *r.verifier, r.encoded[0], 32).status().code(),
            absl::StatusCode::kUnauthenticated);
  // A list that gives this participant another key, or leaves it out.
  keys = r.keys;
  keys["peer-0"] = keys["peer-1"];
  EXPECT_THAT(r.maskers[0].Mask(0, keys, *r.verifier, r.encoded[0], 32).status().message(),
              HasSubstr("lists another mask key for peer-0"));
  keys.erase("peer-0");
  EXPECT_THAT(r.maskers[0].Mask(0, keys, *r.verifier, r.encoded[0], 32).status().message(),
              HasSubstr("does not list peer-0"));
}

TEST(PairwiseRoundTest, MaskedSumRefusesWhatDoesNotFit) {
  Round r = MakeRound(4, 7);
  const auto masked = MaskAll(r, 0);
  EXPECT_FALSE(MaskedSum::Start(r.ids, {}, kSize, 32).ok());
  EXPECT_THAT(MaskedSum::Start(r.ids, {"peer-0", "peer-7"}, kSize, 32).status().message(),
              HasSubstr("not all among"));
  auto sum = MaskedSum::Start(r.ids, {"peer-0", "peer-1", "peer-2"}, kSize, 32);
  ASSERT_TRUE(sum.ok());
  EXPECT_THAT(sum->AddMasked("peer-3", masked[3]).message(), HasSubstr("not among the survivors"));
  EXPECT_THAT(sum->AddMasked("peer-0", std::vector<uint32_t>(3)).message(), HasSubstr("3 values"));
  ASSERT_TRUE(sum->AddMasked("peer-0", masked[0]).ok());
  EXPECT_THAT(sum->AddMasked("peer-0", masked[0]).message(), HasSubstr("given twice"));
  // A reveal made for another S (no seed with peer-3) does not fit.
  auto wrong = r.maskers[1].Reveal(0, r.ids);
  ASSERT_TRUE(wrong.ok());
  EXPECT_THAT(sum->Unmask("peer-1", *wrong).message(),
              HasSubstr("expected exactly the dropped participants (peer-3)"));
  auto finish = sum->Finish();
  EXPECT_EQ(finish.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(finish.status().message(),
              HasSubstr("masked updates missing from peer-1, peer-2; seeds missing from peer-0, "
                        "peer-1, peer-2"));
}

}  // namespace
}  // namespace shoal::privacy::secagg
