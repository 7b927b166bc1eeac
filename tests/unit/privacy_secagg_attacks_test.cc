#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/secagg_federation.h"

namespace shoal::privacy::secagg {
namespace {

using fixture::Config;
using fixture::Drop;
using fixture::Federation;
using fixture::Id;
using ::testing::HasSubstr;

// --- A malicious aggregator ---------------------------------------------------------------------

TEST(SecAggClientTest, RefusesToRevealBothSharesOfOnePeer) {
  Federation f(Config(10, 9, 5, 32, 8));
  f.DropAt(Id(3), Drop::kBeforeMasking);
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_TRUE(f.Check().ok());
  // The server names peer-5, which sent its masked input, as dropped too, to get the share of
  // its mask key along with the share of its self-mask seed.
  v1::UnmaskRequest request = f.requests().at(Id(0));
  request.add_dropped(Id(5));
  auto response = f.client(Id(0)).Unmask(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(),
              HasSubstr("\"peer-5\" is named both as a survivor and as dropped"));
  // Having refused, the client reveals nothing more, not even for an honest request.
  auto again = f.client(Id(0)).Unmask(f.requests().at(Id(0)));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("earlier refusal"));
}

TEST(SecAggClientTest, RefusesUnmaskRequestsOutsideItsNeighbourhoodOrBelowTheThreshold) {
  Federation f(Config(30, 8, 5, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_TRUE(f.Check().ok());
  auto round = SecAggRound::Create(Config(30, 8, 5, 32, 8));
  ASSERT_TRUE(round.ok());
  std::string stranger;
  for (int i = 1; i < 30 && stranger.empty(); ++i) {
    if (!round->graph().AreNeighbours(Id(0), Id(i))) stranger = Id(i);
  }
  ASSERT_FALSE(stranger.empty());
  v1::UnmaskRequest outside = f.requests().at(Id(0));
  outside.add_dropped(stranger);
  auto refused = f.client(Id(0)).Unmask(outside);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("dropped \"", stranger, "\" is not a neighbour")));

  // Claiming all but threshold - 1 neighbours dropped would unmask too much of one input; they
  // are on the survivor list peer-1 signed.
  v1::UnmaskRequest few = f.requests().at(Id(1));
  ASSERT_EQ(few.survivors_size(), 8);
  while (few.survivors_size() > 4) {
    few.add_dropped(few.survivors(few.survivors_size() - 1));
    few.mutable_survivors()->RemoveLast();
  }
  auto below = f.client(Id(1)).Unmask(few);
  EXPECT_EQ(below.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(below.status().message(),
              HasSubstr(absl::StrCat("dropped \"", few.dropped(0),
                                     "\" is on the survivor list this participant signed")));
}

TEST(SecAggClientTest, RefusesASubstitutedKey) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  // The aggregator swaps peer-2's mask key for one it holds the private key of.
  auto own = GenerateX25519KeyPair();
  ASSERT_TRUE(own.ok());
  v1::KeyBundle bundle = f.bundles().at(Id(0));
  bool swapped = false;
  for (v1::AdvertisedKeys& keys : *bundle.mutable_keys()) {
    if (keys.participant_id() == Id(2)) {
      keys.set_mask_public_key(own->public_key);
      swapped = true;
    }
  }
  ASSERT_TRUE(swapped);
  auto shares = f.client(Id(0)).ShareKeys(bundle);
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(shares.status().message(),
              HasSubstr("the keys of \"peer-2\" are refused: the signature of participant "
                        "\"peer-2\" does not verify"));
}

// The signature binds the round: keys advertised for one round are refused in the next, even by
// the same participants under the same identities.
TEST(SecAggClientTest, RefusesKeysAdvertisedForAnotherRound) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  v1::SecAggConfig next = Config(5, 4, 3, 32, 8);
  next.set_round_id("task-7/round-4");
  auto client = SecAggClient::Create(next, Id(0), f.signer(Id(0)), f.verifier());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->AdvertiseKeys().ok());
  auto shares = (*client)->ShareKeys(f.bundles().at(Id(0)));  // round 3's keys
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(shares.status().message(), HasSubstr("the keys of \"peer-1\" are refused"));
}

TEST(SecAggIdentityTest, VerifierNamesWhatIsWrong) {
  EXPECT_THAT(Ed25519KeyVerifier::Create({{"peer-0", "short"}}).status().message(),
              HasSubstr("Ed25519 identity key of \"peer-0\": 5 bytes, expected 32"));
  EXPECT_THAT(Ed25519KeySigner::Create("short").status().message(),
              HasSubstr("Ed25519 identity key: 5 bytes, expected 32"));
  auto identity = GenerateEd25519KeyPair();
  ASSERT_TRUE(identity.ok());
  auto signer = Ed25519KeySigner::Create(identity->private_key);
  auto verifier = Ed25519KeyVerifier::Create({{"peer-0", identity->public_key}});
  ASSERT_TRUE(signer.ok() && verifier.ok());
  auto signature = (*signer)->Sign("message");
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE((*verifier)->Verify("peer-0", "message", *signature).ok());
  EXPECT_EQ((*verifier)->Verify("peer-0", "other message", *signature).code(),
            absl::StatusCode::kUnauthenticated);
  absl::Status unknown = (*verifier)->Verify("peer-1", "message", *signature);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(unknown.message(), HasSubstr("no identity key is known for participant \"peer-1\""));
}

TEST(SecAggServerTest, RefusesKeysNotSignedByTheirParticipant) {
  const v1::SecAggConfig config = Config(5, 4, 3, 32, 8);
  Federation f(config);
  auto keys = f.client(Id(1)).AdvertiseKeys();
  ASSERT_TRUE(keys.ok());
  v1::AdvertisedKeys claimed = *keys;
  claimed.set_participant_id(Id(2));  // peer-1's keys and signature, claimed as peer-2's
  absl::Status s = f.server().AddAdvertisedKeys(claimed);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("participant \"peer-2\" does not verify"));
  v1::AdvertisedKeys short_key = *keys;
  short_key.set_mask_public_key("xyz");
  EXPECT_THAT(f.server().AddAdvertisedKeys(short_key).message(),
              HasSubstr("mask_public_key: 3 bytes, an X25519 key has 32"));
  EXPECT_TRUE(f.server().AddAdvertisedKeys(*keys).ok());
  EXPECT_EQ(f.server().AddAdvertisedKeys(*keys).code(), absl::StatusCode::kAlreadyExists);
}

TEST(SecAggClientTest, RefusesATamperedOrRedirectedShare) {
  for (bool redirect : {false, true}) {
    SCOPED_TRACE(redirect ? "redirected" : "tampered");
    Federation f(Config(5, 4, 3, 32, 8));
    ASSERT_TRUE(f.Advertise().ok());
    ASSERT_TRUE(f.Share().ok());
    v1::EncryptedShares shares = f.relayed().at(Id(0));
    int altered = 0;
    for (v1::EncryptedShare& share : *shares.mutable_shares()) {
      if (share.sender() != Id(1)) continue;
      if (redirect) {
        // The share peer-1 sealed for peer-2, relayed to peer-0 as if it were peer-0's.
        for (const v1::EncryptedShare& other : f.relayed().at(Id(2)).shares()) {
          if (other.sender() == Id(1)) share.set_ciphertext(other.ciphertext());
        }
      } else {
        (*share.mutable_ciphertext())[20] ^= 0x01;
      }
      ++altered;
    }
    ASSERT_EQ(altered, 1);
    auto masked = f.client(Id(0)).MaskInput(shares, f.input(Id(0)));
    EXPECT_EQ(masked.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(masked.status().message(), HasSubstr("the share from \"peer-1\" does not open"));
  }
}

// --- Steps out of order --------------------------------------------------------------------------

TEST(SecAggClientTest, RefusesStepsOutOfOrder) {
  Federation f(Config(5, 4, 3, 32, 8));
  // Asked to unmask before it has even advertised keys: refused, and the round ends for it.
  auto early = f.client(Id(0)).Unmask(v1::UnmaskRequest());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("cannot unmask while advertising keys"));
  EXPECT_THAT(f.client(Id(0)).AdvertiseKeys().status().message(), HasSubstr("earlier refusal"));

  // Masking before sharing, and unmasking twice.
  ASSERT_TRUE(f.client(Id(1)).AdvertiseKeys().ok());
  EXPECT_THAT(f.client(Id(1)).MaskInput(v1::EncryptedShares(), f.input(Id(1))).status().message(),
              HasSubstr("cannot mask the input while sharing keys"));

  Federation g(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(g.Run().ok());
  auto twice = g.client(Id(2)).Unmask(g.requests().at(Id(2)));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("cannot unmask while done"));
}

TEST(SecAggServerTest, RefusesStepsOutOfOrder) {
  Federation f(Config(5, 4, 3, 32, 8));
  auto early = f.server().CloseSharing();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("cannot close sharing while advertising keys"));
  v1::MaskedInput input;
  input.set_participant_id(Id(0));
  EXPECT_THAT(f.server().AddMaskedInput(input).message(),
              HasSubstr("cannot take a masked input while advertising keys"));
  ASSERT_TRUE(f.Advertise().ok());
  v1::AdvertisedKeys late;
  EXPECT_EQ(f.server().AddAdvertisedKeys(late).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SecAggServerTest, RefusesABadMaskedInputAndGoesOnWithoutIt) {
  Federation f(Config(5, 4, 3, 8, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  v1::MaskedInput wrong;
  wrong.set_participant_id(Id(4));
  wrong.set_values(std::string(4 * 7, '\0'));
  EXPECT_THAT(f.server().AddMaskedInput(wrong).message(),
              HasSubstr("28 bytes, expected 32 (8 values)"));
  wrong.set_values(std::string(4 * 8, '\x01'));  // 0x01010101 is outside an 8-bit ring
  EXPECT_THAT(f.server().AddMaskedInput(wrong).message(), HasSubstr("outside the ring"));
  f.DropAt(Id(4), Drop::kBeforeMasking);
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_TRUE(f.Check().ok());
  auto sum = f.Unmask();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, f.ExpectedSum());
}

TEST(SecAggServerTest, RefusesMalformedShareMessages) {
  const v1::SecAggConfig config = Config(10, 4, 3, 32, 8);
  Federation f(config);
  ASSERT_TRUE(f.Advertise().ok());
  auto shares = f.client(Id(0)).ShareKeys(f.bundles().at(Id(0)));
  ASSERT_TRUE(shares.ok()) << shares.status();
  ASSERT_EQ(shares->shares_size(), 4);
  auto round = SecAggRound::Create(config);
  ASSERT_TRUE(round.ok());
  std::string stranger;
  for (int i = 1; i < 10 && stranger.empty(); ++i) {
    if (!round->graph().AreNeighbours(Id(0), Id(i))) stranger = Id(i);
  }
  ASSERT_FALSE(stranger.empty());

  EXPECT_THAT(f.server().AddShares(v1::EncryptedShares()).message(), HasSubstr("holds none"));
  v1::EncryptedShares missing = *shares;
  const std::string last = missing.shares(3).recipient();
  missing.mutable_shares()->RemoveLast();
  EXPECT_THAT(f.server().AddShares(missing).message(),
              HasSubstr(absl::StrCat("no share for neighbour \"", last, "\"")));
  v1::EncryptedShares outside = *shares;
  outside.mutable_shares(0)->set_recipient(stranger);
  EXPECT_THAT(f.server().AddShares(outside).message(),
              HasSubstr(absl::StrCat("recipient \"", stranger, "\" is not a neighbour")));
  v1::EncryptedShares twice = *shares;
  *twice.add_shares() = shares->shares(0);
  EXPECT_THAT(f.server().AddShares(twice).message(), HasSubstr("two shares for"));
  v1::EncryptedShares mixed = *shares;
  mixed.mutable_shares(1)->set_sender(Id(1));
  EXPECT_THAT(f.server().AddShares(mixed).message(), HasSubstr("it holds a share from \"peer-1\""));
  v1::EncryptedShares cut = *shares;
  cut.mutable_shares(2)->set_ciphertext("abc");
  EXPECT_THAT(f.server().AddShares(cut).message(), HasSubstr("too short to be sealed"));
  // None of those counted: the sender's honest message is taken.
  EXPECT_TRUE(f.server().AddShares(*shares).ok());
}

TEST(SecAggServerTest, RefusesAnUnmaskResponseRevealingWhatWasNotAskedFor) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_TRUE(f.Check().ok());
  auto response = f.client(Id(0)).Unmask(f.requests().at(Id(0)));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->shares(0).owner(), Id(1));
  // A survivor's seed share passed off as a share of its mask key.
  v1::UnmaskResponse swapped = *response;
  const std::string bytes = swapped.shares(0).self_mask_seed_share();
  swapped.mutable_shares(0)->set_mask_key_share(bytes);
  absl::Status s = f.server().AddUnmaskResponse(swapped);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("a mask key share of \"peer-1\" was not asked for"));
  // Two owners' shares swapped: peer-2 holds share 2 of peer-1's seed and share 3 of peer-3's.
  auto other = f.client(Id(2)).Unmask(f.requests().at(Id(2)));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->shares(1).owner(), Id(1));
  ASSERT_EQ(other->shares(2).owner(), Id(3));
  v1::UnmaskResponse exchanged = *other;
  exchanged.mutable_shares(1)->set_self_mask_seed_share(other->shares(2).self_mask_seed_share());
  exchanged.mutable_shares(2)->set_self_mask_seed_share(other->shares(1).self_mask_seed_share());
  EXPECT_THAT(f.server().AddUnmaskResponse(exchanged).message(),
              HasSubstr("the share of \"peer-1\" has index 3 and size 32; expected index 2"));
  EXPECT_TRUE(f.server().AddUnmaskResponse(*other).ok());
  EXPECT_TRUE(f.server().AddUnmaskResponse(*response).ok());
  EXPECT_EQ(f.server().AddUnmaskResponse(*response).code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace shoal::privacy::secagg
