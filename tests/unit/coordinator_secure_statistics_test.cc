// The federation's statistics under secure aggregation: the coordinator (fake clock, fake
// aggregator, real store) and each peer's real SecureMoments (Ed25519 identities, X25519 masks)
// exchange the masking's steps; the statistics fixed are those of the peers' moments pooled,
// while the coordinator only ever receives mask keys, masked moments and self-mask seeds. A
// participant that leaves, sets up again or stays silent past a step's deadline makes the others
// mask again without its moments.

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
#include "tests/unit/statistics_testing.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers
using statistics_testing::Moments;
using statistics_testing::MomentsOfA;
using statistics_testing::MomentsOfB;

constexpr double kBound = 100;

// min_participants 3, round_deadline_seconds 30 (core_testing::Spec): a step's deadline.
common::v1::TaskSpec SecureCsvSpec(const std::string& name) {
  common::v1::TaskSpec spec = statistics_testing::CsvStandardize(Spec(name, 3, 5));
  auto& sa = *spec.mutable_privacy()->mutable_secure_aggregation();
  sa.set_clip_norm(1);
  sa.set_feature_bound(kBound);
  return spec;
}

class SecureStatisticsTest : public CoordinatorCoreTest {
 protected:
  struct Peer {
    std::shared_ptr<FakeSink> sink;
    std::optional<peer::SecureMoments> party;
    size_t seen = 0;      // events of the sink already answered
    bool reveals = true;  // answers SecureStatistics.unmask
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
          if (event.secure_statistics().unmask() && !p.reveals) continue;
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

  // `d` passes on the fake clock; every peer heartbeats (so that none is lost) and the core
  // runs its timers.
  void Wait(absl::Duration d) {
    clock_.Advance(d);
    v1::PeerMessage heartbeat;
    heartbeat.mutable_heartbeat();
    for (const auto& [id, p] : peers_) ASSERT_TRUE(core_->OnMessage(id, heartbeat).ok()) << id;
    Step();
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
      {"a", MomentsOfA()}, {"b", MomentsOfB()}, {"c", Moments(5, {-3.25, 50}, {20.5, 500})}};
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

// A participant that stays connected but does not answer a step (its masked moments, or its
// self-mask seed) is dropped at the step's deadline; the others mask again without it, and its
// moments never enter the sum. Parameter: it is silent at the seed step (else at the masking).
class SilentParticipantTest : public SecureStatisticsTest,
                              public ::testing::WithParamInterface<bool> {};

TEST_P(SilentParticipantTest, IsDroppedAtTheStepDeadlineAndTheOthersMaskAgain) {
  const bool silent_on_seed = GetParam();
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(SecureCsvSpec("t")).ok());
  const std::map<std::string, data::FeatureMoments> moments = {
      {"a", MomentsOfA()},
      {"b", MomentsOfB()},
      {"d", Moments(5, {-3.25, 50}, {20.5, 500})},
      {"s", Moments(7, {490, 70}, {3.5e4, 700})}};
  for (const auto& [id, m] : moments) JoinWithIdentity(id);
  Step();
  SendMoments("a", moments.at("a"));
  SendMoments("b", moments.at("b"));
  SendMoments("s", moments.at("s"));  // a, b and s mask
  SendMoments("d", moments.at("d"));  // d waits for their sum
  if (silent_on_seed) {
    peers_["s"].reveals = false;
  } else {
    peers_["s"].party.reset();
  }
  Pump();
  EXPECT_EQ(masked_.size(), silent_on_seed ? 3u : 2u);

  Wait(absl::Seconds(29));
  Pump();
  EXPECT_FALSE(Status("t").has_statistics());
  EXPECT_EQ(metrics_->statistics_dropped.Value(), 0);
  const size_t before = peers_["s"].sink->events.size();
  Wait(absl::Seconds(1));  // the step's deadline: s is dropped, a, b and d mask
  EXPECT_EQ(metrics_->statistics_dropped.Value(), 1);
  for (size_t i = before; i < peers_["s"].sink->events.size(); ++i) {
    EXPECT_FALSE(peers_["s"].sink->events[i].has_secure_statistics()) << "s is not asked again";
  }
  // Its late key is refused until it reconnects.
  auto late = peer::SecureMoments::Create("t", "s", moments.at("s"), kBound, signers_["s"]);
  ASSERT_TRUE(late.ok());
  auto key = late->Advertise(1);
  ASSERT_TRUE(key.ok());
  absl::Status s = core_->OnMessage("s", Wrap(*key));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("dropped from the masking"));

  peers_["s"].party.reset();
  Pump();
  ExpectPooled({{"a", moments.at("a")}, {"b", moments.at("b")}, {"d", moments.at("d")}});
  EXPECT_THAT(Ids(Status("t").statistics().peers()), ElementsAre("a", "b", "d"));
  EXPECT_EQ(metrics_->statistics_dropped.Value(), 1);
}

INSTANTIATE_TEST_SUITE_P(Steps, SilentParticipantTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Seed" : "Masking"; });

TEST_F(SecureStatisticsTest, ADroppedPeerTakesPartAgainOnceItReconnects) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(SecureCsvSpec("t")).ok());
  const std::map<std::string, data::FeatureMoments> moments = {
      {"a", MomentsOfA()}, {"b", MomentsOfB()}, {"s", Moments(5, {-3.25, 50}, {20.5, 500})}};
  for (const auto& [id, m] : moments) JoinWithIdentity(id);
  Step();
  for (const auto& [id, m] : moments) SendMoments(id, m);
  peers_["s"].party.reset();
  Pump();
  Wait(absl::Seconds(30));  // s is dropped; a and b are two of the three a masking takes
  Pump();
  EXPECT_FALSE(Status("t").has_statistics());
  EXPECT_EQ(metrics_->statistics_dropped.Value(), 1);

  JoinWithIdentity("s");  // a new session, which sets up again
  peers_["s"].seen = 0;
  SendMoments("s", moments.at("s"));
  Pump();
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
