// The federation's statistics under secure aggregation: the coordinator (fake clock, fake
// aggregator, real store) and each peer's real SecureMoments (Ed25519 identities, X25519 masks)
// exchange the masking's steps; the statistics fixed are those of the peers' moments pooled,
// while the coordinator only ever receives mask keys, masked moments and self-mask seeds.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>

#include "libs/privacy/crypto.h"
#include "libs/privacy/moments_codec.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/federation_statistics.h"
#include "services/peer_agent/secure_moments.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers

constexpr double kBound = 100;

common::v1::TaskSpec SecureCsvSpec(const std::string& name) {
  common::v1::TaskSpec spec = Spec(name, 3, 5);
  common::v1::DatasetSpec& d = *spec.mutable_dataset();
  d.clear_name();
  d.set_format(common::v1::DATA_FORMAT_CSV);
  d.set_train("train.csv");
  d.set_label_column("y");
  d.set_num_classes(2);
  d.set_test_fraction(0.2);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  auto& sa = *spec.mutable_privacy()->mutable_secure_aggregation();
  sa.set_clip_norm(1);
  sa.set_feature_bound(kBound);
  return spec;
}

data::FeatureMoments Moments(uint64_t count, std::vector<double> sum,
                             std::vector<double> sum_squares) {
  return data::FeatureMoments{count, std::move(sum), std::move(sum_squares)};
}

class SecureStatisticsTest : public CoordinatorCoreTest {
 protected:
  struct Peer {
    std::shared_ptr<FakeSink> sink;
    std::optional<peer::SecureMoments> party;
    size_t seen = 0;  // events of the sink already answered
  };

  // Joins `id` with a fresh identity key, as a peer process does.
  void JoinWithIdentity(const std::string& id) {
    absl::StatusOr<privacy::KeyPair> keys = privacy::GenerateEd25519KeyPair();
    ASSERT_TRUE(keys.ok());
    auto signer = privacy::secagg::Ed25519KeySigner::Create(keys->private_key);
    ASSERT_TRUE(signer.ok());
    signers_[id] = std::move(*signer);
    v1::Hello hello = Hello(id);
    hello.set_identity_public_key(keys->public_key);
    peers_[id].sink = std::make_shared<FakeSink>();
    ASSERT_TRUE(core_->Connect(hello, "", peers_[id].sink).ok());
  }

  // `id` starts the masking with `moments` (its first mask key, attempt 0).
  void SendMoments(const std::string& id, const data::FeatureMoments& moments) {
    auto party = peer::SecureMoments::Create("t", id, moments, kBound, signers_[id]);
    ASSERT_TRUE(party.ok()) << party.status();
    peers_[id].party.emplace(*std::move(party));
    auto key = peers_[id].party->Advertise(0);
    ASSERT_TRUE(key.ok());
    ASSERT_TRUE(core_->OnMessage(id, Wrap(*key)).ok());
  }

  static v1::PeerMessage Wrap(const v1::SecureMoments& step) {
    v1::PeerMessage m;
    m.set_task("t");
    *m.mutable_data_moments()->mutable_secure() = step;
    return m;
  }

  // Delivers the coordinator's steps to the peers and their answers back, until none is left.
  void Pump() {
    for (bool more = true; more;) {
      more = false;
      for (auto& [id, p] : peers_) {
        if (!p.party.has_value()) continue;
        for (; p.seen < p.sink->events.size(); ++p.seen) {
          const v1::CoordinatorEvent event = p.sink->events[p.seen];
          if (!event.has_secure_statistics()) continue;
          more = true;
          auto answer = p.party->Answer(event.secure_statistics());
          ASSERT_TRUE(answer.ok()) << id << ": " << answer.status();
          if (!answer->has_value()) continue;
          if ((*answer)->has_masked()) masked_[id] = (*answer)->masked();
          // A step of an abandoned masking is refused as stale, nothing else is.
          absl::Status s = core_->OnMessage(id, Wrap(**answer));
          ASSERT_TRUE(s.ok() || absl::IsFailedPrecondition(s)) << id << ": " << s;
          stale_ += s.ok() ? 0 : 1;
        }
      }
    }
  }

  // The statistics fixed from `moments` pooled: as the plain path computes them.
  void ExpectPooled(const std::map<std::string, data::FeatureMoments>& moments) {
    const v1::TaskStatus status = Status("t");
    ASSERT_TRUE(status.has_statistics());
    auto plain = AddUpStatistics(moments, absl::UnixEpoch());
    ASSERT_TRUE(plain.ok());
    const common::v1::FederationStatistics& got = status.statistics();
    EXPECT_EQ(got.samples(), plain->samples());
    EXPECT_THAT(Ids(got.peers()), ::testing::ElementsAreArray(Ids(plain->peers())));
    ASSERT_EQ(got.mean_size(), plain->mean_size());
    for (int j = 0; j < got.mean_size(); ++j) {
      EXPECT_NEAR(got.mean(j), plain->mean(j), 1e-9) << j;
      EXPECT_NEAR(got.std(j), plain->std(j), 1e-9) << j;
    }
    for (const auto& [id, p] : peers_) {
      const v1::CoordinatorEvent& last = p.sink->events.back();
      ASSERT_TRUE(last.has_statistics()) << id;
      EXPECT_EQ(last.statistics().SerializeAsString(), got.SerializeAsString()) << id;
    }
  }

  std::map<std::string, std::shared_ptr<const privacy::secagg::KeySigner>> signers_;
  std::map<std::string, Peer> peers_;
  std::map<std::string, std::string> masked_;  // the masked moments each peer sent, last
  int stale_ = 0;                              // steps the coordinator refused as stale
};

TEST_F(SecureStatisticsTest, TheStatisticsAreThePooledOnesAndTheCoordinatorSeesOnlyMasks) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(SecureCsvSpec("t")).ok());
  const std::map<std::string, data::FeatureMoments> moments = {
      {"a", Moments(2, {4, 20}, {10, 200})},
      {"b", Moments(1, {8, 10}, {64, 100})},
      {"c", Moments(5, {-3.25, 50}, {20.5, 500})}};
  for (const auto& [id, m] : moments) JoinWithIdentity(id);
  Step();

  // Plain moments are refused in a secure task: the coordinator never holds them.
  v1::PeerMessage plain;
  plain.set_task("t");
  plain.mutable_data_moments()->set_count(2);
  plain.mutable_data_moments()->add_sum(4);
  plain.mutable_data_moments()->add_sum_squares(10);
  absl::Status s = core_->OnMessage("a", plain);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("must come masked"));

  SendMoments("a", moments.at("a"));
  SendMoments("b", moments.at("b"));
  Pump();
  EXPECT_FALSE(Status("t").has_statistics()) << "2 of min_participants 3 peers";
  EXPECT_TRUE(masked_.empty()) << "nobody masks before 3 peers are there";
  SendMoments("c", moments.at("c"));
  Pump();
  ExpectPooled(moments);

  // What the coordinator got of each peer is masked: it decodes to nothing like its moments.
  auto codec = privacy::MomentsCodec::Create(2, kBound);
  ASSERT_TRUE(codec.ok());
  ASSERT_EQ(masked_.size(), 3u);
  for (const auto& [id, bytes] : masked_) {
    std::vector<uint32_t> ring(bytes.size() / 4);
    std::memcpy(ring.data(), bytes.data(), bytes.size());
    EXPECT_FALSE(codec->DecodeSum(ring, 1).ok()) << id;
  }
}

TEST_F(SecureStatisticsTest, AParticipantThatLeavesMidMaskingMakesTheOthersMaskAgain) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(SecureCsvSpec("t")).ok());
  const std::map<std::string, data::FeatureMoments> moments = {{"a", Moments(2, {4}, {10})},
                                                               {"b", Moments(1, {8}, {64})},
                                                               {"c", Moments(9, {90}, {900})},
                                                               {"d", Moments(3, {-6}, {14})}};
  for (const auto& [id, m] : moments) JoinWithIdentity(id);
  Step();
  SendMoments("a", moments.at("a"));
  SendMoments("b", moments.at("b"));
  SendMoments("c", moments.at("c"));
  // a and b mask; c leaves before it does (its list is never answered).
  peers_["c"].seen = peers_["c"].sink->events.size();
  peers_["c"].party.reset();
  Pump();
  EXPECT_EQ(masked_.size(), 2u);
  core_->Disconnect("c", peers_["c"].sink.get());
  Step();
  // d comes with a key of attempt 0 and is told to mask afresh with a and b.
  SendMoments("d", moments.at("d"));
  Pump();
  peers_.erase("c");
  ExpectPooled({{"a", moments.at("a")}, {"b", moments.at("b")}, {"d", moments.at("d")}});
  EXPECT_THAT(Ids(Status("t").statistics().peers()), ElementsAre("a", "b", "d"));
}

TEST_F(SecureStatisticsTest, APeerThatSetsUpAgainDuringTheMaskingMakesEveryoneMaskAgain) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(SecureCsvSpec("t")).ok());
  const std::map<std::string, data::FeatureMoments> moments = {
      {"a", Moments(2, {4}, {10})}, {"b", Moments(1, {8}, {64})}, {"c", Moments(9, {90}, {900})}};
  for (const auto& [id, m] : moments) JoinWithIdentity(id);
  Step();
  for (const auto& [id, m] : moments) SendMoments(id, m);
  // b starts over (a new session): what it was sent of the first masking is lost.
  peers_["b"].seen = peers_["b"].sink->events.size();
  SendMoments("b", moments.at("b"));
  Pump();
  EXPECT_GT(stale_, 0) << "a and c masked for the abandoned attempt";
  ExpectPooled(moments);
}

TEST_F(SecureStatisticsTest, ACsvTaskWithoutAFeatureBoundIsRefused) {
  common::v1::TaskSpec spec = SecureCsvSpec("t");
  spec.mutable_privacy()->mutable_secure_aggregation()->clear_feature_bound();
  absl::Status s = core_->CreateTask(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("privacy.secure_aggregation.feature_bound"));
}

}  // namespace
}  // namespace shoal::coordinator
