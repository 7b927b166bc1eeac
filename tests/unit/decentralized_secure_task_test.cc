// The coordinator's side of secure aggregation in decentralized mode (DecentralizedTask with
// privacy.secure_aggregation): the PeerList carries every participant's identity and signed mask
// keys, the survivors are fixed once everyone holds every masked update (Unmask), their reveals
// go to all of them together (MaskReveals), and a survivor lost in between restarts the round.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/coordinator/modes/decentralized/decentralized_task.h"
#include "tests/unit/decentralized_task_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::shoal::coordinator::decentralized_testing;  // NOLINT: the fixture's helpers

constexpr Kind kUnmask = v1::CoordinatorEvent::kUnmask;
constexpr Kind kMaskReveals = v1::CoordinatorEvent::kMaskReveals;

v1::PeerMessage KeyedReady(uint64_t round, const std::string& id) {
  v1::PeerMessage m = Ready(round);
  m.mutable_round_ready()->set_mask_public_key("mask-" + id);
  m.mutable_round_ready()->set_mask_key_signature("sig-" + id);
  return m;
}

v1::PeerMessage HeldAll(uint64_t round, uint32_t attempt) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_masked_updates_held()->set_round(round);
  m.mutable_masked_updates_held()->set_attempt(attempt);
  return m;
}

v1::PeerMessage Reveal(uint64_t round, uint32_t attempt, const std::string& id) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_mask_reveal()->set_round(round);
  m.mutable_mask_reveal()->set_attempt(attempt);
  m.mutable_mask_reveal()->mutable_seeds()->set_self_seed("seed-" + id);
  return m;
}

class DecentralizedSecureTaskTest : public DecentralizedTaskTest {
 protected:
  // Four peers with identity keys, round 1 joined, ready and connected: StartSharing sent.
  // `distributed`: privacy.dp at level peer, each participant adding its share of the noise.
  void StartSharing(bool distributed = false) {
    common::v1::TaskSpec spec = Spec(3, 1);
    spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(1);
    if (distributed) {
      common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
      dp.set_level(common::v1::DP_LEVEL_PEER);
      dp.set_noise(common::v1::DP_NOISE_DISTRIBUTED);
      dp.set_clip_norm(1);
      dp.set_noise_multiplier(1);
      dp.set_delta(1e-5);
    }
    Make(spec);
    for (const std::string id : {"a", "b", "c", "d"}) {
      ModeEffects fx;
      task_->AddPeer(ModePeer{id, "127.0.0.1:900" + id, "identity-" + id}, now_, status_, fx);
      Send(id, Held(0));
    }
    for (const std::string id : {"a", "b", "c", "d"}) Send(id, Join(1));
    // A RoundReady without a mask key is refused, naming the peer.
    ModeEffects fx = Send("a", Ready(1), absl::StatusCode::kInvalidArgument);
    for (const std::string id : {"a", "b", "c", "d"}) fx = Send(id, KeyedReady(1, id));
    const v1::PeerList list = Events(fx, "b", kPeerList).at(0).peer_list();
    ASSERT_EQ(list.participants_size(), 4);
    for (const v1::PeerEndpoint& p : list.participants()) {
      EXPECT_EQ(p.identity_public_key(), "identity-" + p.peer_id());
      EXPECT_EQ(p.mask_public_key(), "mask-" + p.peer_id());
      EXPECT_EQ(p.mask_key_signature(), "sig-" + p.peer_id());
    }
    for (const std::string id : {"a", "b", "c", "d"}) fx = Send(id, Report(1, 1, {}));
    ASSERT_THAT(Kinds(fx, "a"), ElementsAre(kStartSharing));
  }
};

TEST_F(DecentralizedSecureTaskTest, APeerLostAfterMaskingIsLeftOutOfTheSurvivors) {
  StartSharing();
  Send("a", HeldAll(1, 1));
  // d dies before it holds every masked update: the others get a sharing list without it.
  ModeEffects fx = Remove("d");
  const v1::PeerList list = Events(fx, "a", kPeerList).at(0).peer_list();
  EXPECT_TRUE(list.sharing());
  EXPECT_EQ(list.attempt(), 2u);
  EXPECT_THAT(Ids(list), ElementsAre("a", "b", "c"));
  Send("b", HeldAll(1, 1), absl::StatusCode::kFailedPrecondition);      // the old attempt
  Send("a", Reveal(1, 2, "a"), absl::StatusCode::kFailedPrecondition);  // not asked for yet
  Send("a", HeldAll(1, 2));
  EXPECT_TRUE(Send("b", HeldAll(1, 2)).events.empty());
  fx = Send("c", HeldAll(1, 2));
  for (const std::string id : {"a", "b", "c"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kUnmask));
    const v1::Unmask unmask = Events(fx, id, kUnmask)[0].unmask();
    EXPECT_EQ(unmask.attempt(), 2u);
    EXPECT_THAT(unmask.survivors(), ElementsAre("a", "b", "c"));
  }
  Send("a", Reveal(1, 2, "a"));
  EXPECT_TRUE(Send("b", Reveal(1, 2, "b")).events.empty());
  fx = Send("c", Reveal(1, 2, "c"));
  for (const std::string id : {"a", "b", "c"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kMaskReveals));
    const v1::MaskReveals reveals = Events(fx, id, kMaskReveals)[0].mask_reveals();
    ASSERT_EQ(reveals.seeds_size(), 3);
    EXPECT_EQ(reveals.seeds().at("b").self_seed(), "seed-b");
  }
  Send("a", Shared(1, 2));
  Send("b", Shared(1, 2));
  fx = Send("c", Shared(1, 2));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_THAT(fx.rounds_completed[0].participants(), ElementsAre("a", "b", "c"));
  EXPECT_EQ(fx.rounds_completed[0].leaves(), 1u);
}

// With noise distributed the survivors' shares must add up to the whole noise: a participant lost
// after the masking takes its share along, so the others mask again for their new number (a
// PeerList that is not a sharing one) and connect again before they share.
TEST_F(DecentralizedSecureTaskTest, DistributedNoiseMasksAgainWhenAParticipantIsLost) {
  StartSharing(/*distributed=*/true);
  EXPECT_EQ(status_.privacy().rounds(), 1u);  // charged once, when the round opened
  Send("a", HeldAll(1, 1));
  ModeEffects fx = Remove("d");
  const v1::PeerList list = Events(fx, "a", kPeerList).at(0).peer_list();
  EXPECT_FALSE(list.sharing());
  EXPECT_EQ(list.attempt(), 2u);
  EXPECT_THAT(Ids(list), ElementsAre("a", "b", "c"));
  Send("a", HeldAll(1, 2), absl::StatusCode::kFailedPrecondition);  // not sharing yet
  for (const std::string id : {"a", "b", "c"}) fx = Send(id, Report(1, 2, {}));
  ASSERT_THAT(Kinds(fx, "a"), ElementsAre(kStartSharing));
  for (const std::string id : {"a", "b", "c"}) fx = Send(id, HeldAll(1, 2));
  EXPECT_THAT(Events(fx, "a", kUnmask).at(0).unmask().survivors(), ElementsAre("a", "b", "c"));
  for (const std::string id : {"a", "b", "c"}) Send(id, Reveal(1, 2, id));
  for (const std::string id : {"a", "b", "c"}) fx = Send(id, Shared(1, 2));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_EQ(status_.privacy().rounds(), 1u);
}

TEST_F(DecentralizedSecureTaskTest, ASurvivorLostBeforeEveryRevealIsInRestartsTheRound) {
  StartSharing();
  ModeEffects fx;
  for (const std::string id : {"a", "b", "c", "d"}) fx = Send(id, HeldAll(1, 1));
  ASSERT_THAT(Kinds(fx, "d"), ElementsAre(kUnmask));
  Send("a", Reveal(1, 1, "a"));
  // d's self seed may be out: it cannot be dropped. Everyone leaves the round and joins again.
  fx = Remove("d");
  for (const std::string id : {"a", "b", "c"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kJoinRefused, kRoundOpen));
    EXPECT_THAT(Events(fx, id, kJoinRefused)[0].join_refused().reason(),
                HasSubstr("the round starts over"));
    EXPECT_EQ(Events(fx, id, kRoundOpen)[0].round_open().round(), 1u);
  }
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_JOINING);
  Send("b", Reveal(1, 1, "b"), absl::StatusCode::kFailedPrecondition);
  // Trained again with fresh keys, the round completes with the three.
  for (const std::string id : {"a", "b", "c"}) Send(id, Join(1));
  for (const std::string id : {"a", "b", "c"}) fx = Send(id, KeyedReady(1, id));
  const uint32_t attempt = Events(fx, "a", kPeerList).at(0).peer_list().attempt();
  for (const std::string id : {"a", "b", "c"}) Send(id, Report(1, attempt, {}));
  for (const std::string id : {"a", "b", "c"}) Send(id, HeldAll(1, attempt));
  for (const std::string id : {"a", "b", "c"}) Send(id, Reveal(1, attempt, id));
  for (const std::string id : {"a", "b", "c"}) fx = Send(id, Shared(1, attempt));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_THAT(fx.rounds_completed[0].participants(), ElementsAre("a", "b", "c"));
}

TEST_F(DecentralizedSecureTaskTest, ASurvivorLostAfterTheRevealsLeavesTheOthersToFinish) {
  StartSharing();
  for (const std::string id : {"a", "b", "c", "d"}) Send(id, HeldAll(1, 1));
  for (const std::string id : {"a", "b", "c", "d"}) Send(id, Reveal(1, 1, id));
  Send("d", Shared(1, 1));
  EXPECT_TRUE(Remove("c").events.empty());  // its update is in every survivor's sum already
  Send("a", Shared(1, 1));
  ModeEffects fx = Send("b", Shared(1, 1));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
}

}  // namespace
}  // namespace shoal::coordinator
