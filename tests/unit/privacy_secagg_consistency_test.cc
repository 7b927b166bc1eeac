// The consistency check of SecAgg+ (libs/privacy/secagg/round.h, step 4): the survivors sign the
// survivor list, and a participant unmasks only with threshold signatures of the list it signed.

#include <map>
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

std::vector<std::string> Signers(const v1::UnmaskRequest& request) {
  std::vector<std::string> ids;
  for (const auto& signature : request.survivor_signatures())
    ids.push_back(signature.participant_id());
  return ids;
}

// --- Honest rounds ------------------------------------------------------------------------------

TEST(SecAggConsistencyTest, EverySurvivorSignsTheSameListAndTheSumIsExact) {
  Federation f(Config(10, 9, 5, 32, 16));
  f.DropAt(Id(7), Drop::kBeforeMasking);
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_EQ(f.checks().size(), 9u);
  for (const auto& [id, check] : f.checks()) {
    EXPECT_EQ(std::vector<std::string>(check.survivors().begin(), check.survivors().end()),
              f.ExpectedSurvivors())
        << id;
  }
  ASSERT_TRUE(f.Check().ok());
  for (const auto& [id, request] : f.requests()) {
    EXPECT_EQ(Signers(request), f.ExpectedSurvivors()) << id;
  }
  auto sum = f.Unmask();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, f.ExpectedSum());
}

// A survivor that does not sign is not asked to unmask, but its input stays in the sum (its self
// mask is removed with its neighbours' shares).
TEST(SecAggConsistencyTest, ASurvivorThatDoesNotSignStaysInTheSum) {
  Federation f(Config(8, 7, 5, 32, 16));
  f.DropAt(Id(3), Drop::kBeforeSigning);
  auto sum = f.Run();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, f.ExpectedSum());
  EXPECT_THAT(f.server().survivors(), ::testing::Contains(Id(3)));
  EXPECT_EQ(f.server().survivors().size(), 8u);
  EXPECT_EQ(f.requests().count(Id(3)), 0u);
  for (const auto& [id, request] : f.requests()) {
    EXPECT_EQ(request.survivor_signatures_size(), 7) << id;
    EXPECT_THAT(request.survivors(), ::testing::Contains(Id(3))) << id;
  }
}

TEST(SecAggConsistencyTest, FewerSignaturesThanTheThresholdFailTheRound) {
  Federation f(Config(5, 4, 3, 32, 8));
  for (int i : {1, 2, 3}) f.DropAt(Id(i), Drop::kBeforeSigning);
  auto sum = f.Run();
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_THAT(sum.status().message(),
              HasSubstr("consistency check: 2 of the 5 survivors signed the survivor list, fewer "
                        "than the threshold 3"));
  EXPECT_EQ(f.server().CloseUnmasking().status().code(), absl::StatusCode::kFailedPrecondition);
}

// --- A malicious aggregator ---------------------------------------------------------------------

// The aggregator tells peer-0 and peer-1 that peer-4 dropped out (so that they reveal shares of
// its mask key) and the others that it survived (so that they reveal shares of its self-mask
// seed). Each group signs the list it got; neither list has threshold signatures, and a
// signature of one list does not verify over the other: peer-0 refuses, revealing nothing.
TEST(SecAggConsistencyTest, DifferentSurvivorListsAreRefused) {
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "the other list's signatures relayed" : "only its own list's signatures");
    Federation f(Config(5, 4, 3, 32, 8));
    ASSERT_TRUE(f.Advertise().ok());
    ASSERT_TRUE(f.Share().ok());
    ASSERT_TRUE(f.Mask().ok());
    v1::ConsistencyCheckRequest without;
    for (int i : {0, 1, 2, 3}) without.add_survivors(Id(i));
    std::map<std::string, v1::ConsistencyCheckResponse> signatures;
    for (int i = 0; i < 5; ++i) {
      auto signature = f.client(Id(i)).SignSurvivors(i < 2 ? without : f.checks().at(Id(i)));
      ASSERT_TRUE(signature.ok()) << signature.status();
      signatures[Id(i)] = *signature;
    }
    // The server itself takes only signatures of the list it holds.
    absl::Status taken = f.server().AddSurvivorSignature(signatures.at(Id(0)));
    EXPECT_EQ(taken.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(taken.message(), HasSubstr("survivor-list signature of \"peer-0\" is refused"));

    v1::UnmaskRequest request;
    for (int i : {1, 2, 3}) request.add_survivors(Id(i));
    request.add_dropped(Id(4));
    for (int i : {0, 1}) *request.add_survivor_signatures() = signatures.at(Id(i));
    if (mixed) *request.add_survivor_signatures() = signatures.at(Id(2));
    auto response = f.client(Id(0)).Unmask(request);
    if (mixed) {
      EXPECT_EQ(response.status().code(), absl::StatusCode::kUnauthenticated);
      EXPECT_THAT(response.status().message(),
                  HasSubstr("the survivor-list signature of \"peer-2\" does not verify over the "
                            "list of 4 survivors this participant signed"));
    } else {
      EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(response.status().message(),
                  HasSubstr("2 signatures of the survivor list this participant signed, fewer "
                            "than the threshold 3"));
    }
    auto again = f.client(Id(0)).Unmask(request);
    EXPECT_THAT(again.status().message(), HasSubstr("earlier refusal"));
  }
}

// Threshold honest signatures of the true list, with an unmask request that names a survivor on
// it as dropped: the request is not what the signed list implies.
TEST(SecAggConsistencyTest, AnUnmaskRequestThatContradictsTheSignedListIsRefused) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_TRUE(f.Check().ok());
  v1::UnmaskRequest request = f.requests().at(Id(0));
  ASSERT_EQ(request.survivors(3), Id(4));
  request.mutable_survivors()->RemoveLast();
  request.add_dropped(Id(4));
  auto response = f.client(Id(0)).Unmask(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(),
              HasSubstr("dropped \"peer-4\" is on the survivor list this participant signed"));
}

TEST(SecAggConsistencyTest, AForgedMissingOrRepeatedSignatureIsRefused) {
  struct Case {
    const char* name;
    void (*alter)(v1::UnmaskRequest&);
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"forged",
       [](v1::UnmaskRequest& r) {
         (*r.mutable_survivor_signatures(2)->mutable_signature())[5] ^= 1;
       },
       absl::StatusCode::kUnauthenticated,
       "the survivor-list signature of \"peer-2\" does not verify"},
      {"another's, relabelled",
       [](v1::UnmaskRequest& r) {
         r.mutable_survivor_signatures(2)->set_signature(r.survivor_signatures(1).signature());
       },
       absl::StatusCode::kUnauthenticated,
       "the survivor-list signature of \"peer-2\" does not verify"},
      {"missing",
       [](v1::UnmaskRequest& r) {
         while (r.survivor_signatures_size() > 2) r.mutable_survivor_signatures()->RemoveLast();
       },
       absl::StatusCode::kFailedPrecondition, "2 signatures of the survivor list"},
      {"repeated",
       [](v1::UnmaskRequest& r) { *r.add_survivor_signatures() = r.survivor_signatures(0); },
       absl::StatusCode::kInvalidArgument, "two survivor-list signatures of \"peer-0\""},
      {"from a participant that dropped out",
       [](v1::UnmaskRequest& r) { r.mutable_survivor_signatures(0)->set_participant_id(Id(5)); },
       absl::StatusCode::kInvalidArgument,
       "the survivor-list signature of \"peer-5\" is not from a survivor"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Federation f(Config(6, 5, 3, 32, 8));
    f.DropAt(Id(5), Drop::kBeforeMasking);
    ASSERT_TRUE(f.Advertise().ok());
    ASSERT_TRUE(f.Share().ok());
    ASSERT_TRUE(f.Mask().ok());
    ASSERT_TRUE(f.Check().ok());
    v1::UnmaskRequest request = f.requests().at(Id(0));
    ASSERT_EQ(request.survivor_signatures_size(), 5);
    c.alter(request);
    auto response = f.client(Id(0)).Unmask(request);
    EXPECT_EQ(response.status().code(), c.code) << response.status();
    EXPECT_THAT(response.status().message(), HasSubstr(c.message));
    // Refused once, the participant reveals nothing, not even for the honest request.
    EXPECT_THAT(f.client(Id(0)).Unmask(f.requests().at(Id(0))).status().message(),
                HasSubstr("earlier refusal"));
  }
}

TEST(SecAggConsistencyTest, TheServerTakesOneValidSignaturePerSurvivor) {
  Federation f(Config(5, 4, 3, 32, 8));
  f.DropAt(Id(4), Drop::kBeforeMasking);
  ASSERT_TRUE(f.Advertise().ok());
  v1::ConsistencyCheckResponse early;
  early.set_participant_id(Id(0));
  EXPECT_THAT(f.server().AddSurvivorSignature(early).message(),
              HasSubstr("cannot take a survivor-list signature while sharing keys"));
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  auto signature = f.client(Id(0)).SignSurvivors(f.checks().at(Id(0)));
  ASSERT_TRUE(signature.ok()) << signature.status();
  v1::ConsistencyCheckResponse outsider = *signature;
  outsider.set_participant_id(Id(4));
  EXPECT_THAT(f.server().AddSurvivorSignature(outsider).message(),
              HasSubstr("\"peer-4\" is refused: the signer is not on the survivor list"));
  // The same list signed for another round does not verify in this one.
  auto other_round =
      f.signer(Id(1))->Sign(SignedSurvivorsMessage("task-7/round-4", f.ExpectedSurvivors()));
  ASSERT_TRUE(other_round.ok());
  v1::ConsistencyCheckResponse replayed;
  replayed.set_participant_id(Id(1));
  replayed.set_signature(*other_round);
  EXPECT_EQ(f.server().AddSurvivorSignature(replayed).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(f.server().AddSurvivorSignature(*signature).ok());
  EXPECT_EQ(f.server().AddSurvivorSignature(*signature).code(), absl::StatusCode::kAlreadyExists);
}

TEST(SecAggConsistencyTest, AParticipantSignsOnlyAListItsOwnStepsAllow) {
  struct Case {
    std::vector<std::string> list;
    absl::StatusCode code;
    std::string message;
  };
  // peer-5 dropped before sharing: peer-0 holds no shares of it, so it cannot be a survivor.
  const Case cases[] = {
      {{Id(0), Id(2), Id(1), Id(3)}, absl::StatusCode::kInvalidArgument, "not sorted by id"},
      {{Id(0), Id(1), Id(1), Id(3)}, absl::StatusCode::kInvalidArgument, "without repeats"},
      {{Id(1), Id(2), Id(3)}, absl::StatusCode::kInvalidArgument, "is not on the list"},
      {{Id(0), Id(1), Id(2), "stranger"},
       absl::StatusCode::kInvalidArgument,
       "\"stranger\" is not a participant"},
      {{Id(0), Id(1), Id(2), Id(5)},
       absl::StatusCode::kInvalidArgument,
       "neighbour \"peer-5\" sent this participant no shares"},
      {{Id(0), Id(1), Id(2)},
       absl::StatusCode::kFailedPrecondition,
       "2 of this participant's neighbours, fewer than the threshold 3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    Federation f(Config(6, 5, 3, 32, 8));
    f.DropAt(Id(5), Drop::kBeforeSharing);
    ASSERT_TRUE(f.Advertise().ok());
    ASSERT_TRUE(f.Share().ok());
    ASSERT_TRUE(f.Mask().ok());
    v1::ConsistencyCheckRequest check;
    for (const std::string& id : c.list) check.add_survivors(id);
    auto signature = f.client(Id(0)).SignSurvivors(check);
    EXPECT_EQ(signature.status().code(), c.code) << signature.status();
    EXPECT_THAT(signature.status().message(), HasSubstr(c.message));
  }
  // And once only.
  Federation g(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(g.Advertise().ok());
  ASSERT_TRUE(g.Share().ok());
  ASSERT_TRUE(g.Mask().ok());
  ASSERT_TRUE(g.client(Id(0)).SignSurvivors(g.checks().at(Id(0))).ok());
  EXPECT_THAT(g.client(Id(0)).SignSurvivors(g.checks().at(Id(0))).status().message(),
              HasSubstr("cannot sign the survivor list while unmasking"));
}

}  // namespace
}  // namespace shoal::privacy::secagg
