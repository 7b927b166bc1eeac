// DecentralizedTask after a coordinator restart: peers re-announce the model they hold, and the
// task resumes from the stored round, or from the round after it when every peer had already
// completed that one before the crash (its record was lost with the old coordinator).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "services/coordinator/modes/decentralized/decentralized_task.h"
#include "tests/unit/decentralized_task_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using namespace ::shoal::coordinator::decentralized_testing;  // NOLINT: the fixture's helpers

class DecentralizedResumeTest : public DecentralizedTaskTest {
 protected:
  // A coordinator that restarted with `stored` rounds of `spec` in its store.
  void Restart(const common::v1::TaskSpec& spec, uint64_t stored) {
    status_ = v1::TaskStatus();
    *status_.mutable_spec() = spec;
    status_.set_model_version(stored);
    task_ = std::make_unique<DecentralizedTask>(status_, metrics_);
  }
};

TEST_F(DecentralizedResumeTest, NoProviderWaitsUntilOneAppears) {
  // After a coordinator restart at round 2, peers re-announce what they hold.
  common::v1::TaskSpec spec = Spec(1, 5);
  status_ = v1::TaskStatus();
  *status_.mutable_spec() = spec;
  status_.set_model_version(2);
  task_ = std::make_unique<DecentralizedTask>(status_, metrics_);
  Add("a");
  ModeEffects fx = Send("a", Held(0));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kWaiting)) << "nobody can serve round 2 yet";
  EXPECT_EQ(PeerState("a"), "syncing");
  Add("b");
  fx = Send("b", Held(2));
  // b holds round 2: a round opens for b, and a gets b as its provider at the next tick.
  EXPECT_THAT(Kinds(fx, "b"), ElementsAre(kRoundOpen));
  EXPECT_EQ(Events(fx, "b", kRoundOpen)[0].round_open().round(), 3u);
  fx = Tick(absl::Seconds(1));
  EXPECT_EQ(Events(fx, "a", kSyncFrom)[0].sync_from().provider().peer_id(), "b");
  EXPECT_EQ(Events(fx, "a", kSyncFrom)[0].sync_from().round(), 2u);
}

TEST_F(DecentralizedResumeTest, PeersPastTheStoredRoundResumeFromTheirModel) {
  // The store knows round 2; the three peers completed round 3 before the coordinator died.
  Restart(Spec(3, 6), 2);
  for (const std::string id : {"a", "b", "c"}) Add(id);
  ModeEffects fx = Send("a", Held(3, 0x333));
  ASSERT_EQ(fx.rounds_completed.size(), 1u) << "round 3 is taken as completed";
  EXPECT_EQ(fx.rounds_completed[0].round(), 3u);
  EXPECT_EQ(fx.rounds_completed[0].model_digest(), 0x333u);
  EXPECT_EQ(status_.model_version(), 3u);
  EXPECT_EQ(PeerState("a"), "synced");
  EXPECT_TRUE(Events(fx, "a", kSyncFrom).empty());
  fx = Send("b", Held(3, 0x333));
  EXPECT_TRUE(fx.rounds_completed.empty());
  EXPECT_EQ(PeerState("b"), "synced");
  fx = Send("c", Held(3, 0x333));
  // All three hold round 3: round 4 opens for them.
  for (const std::string id : {"a", "b", "c"}) {
    ASSERT_EQ(Events(fx, id, kRoundOpen).size(), 1u) << id;
    EXPECT_EQ(Events(fx, id, kRoundOpen)[0].round_open().round(), 4u);
  }
  EXPECT_EQ(status_.history_size(), 1);
}

TEST_F(DecentralizedResumeTest, PeersStillAtTheStoredRoundSyncToTheAdoptedOne) {
  Restart(Spec(2, 6), 2);
  Add("a");
  Add("b");
  Add("c");
  Send("a", Held(2, 0x222));  // removed from round 3 before the crash: still at round 2
  ModeEffects fx = Send("b", Held(3, 0x333));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  // a syncs round 3 from b; c, holding round 3 with another digest (another attempt's
  // average), syncs too.
  ASSERT_EQ(Events(fx, "a", kSyncFrom).size(), 1u);
  EXPECT_EQ(Events(fx, "a", kSyncFrom)[0].sync_from().round(), 3u);
  EXPECT_EQ(Events(fx, "a", kSyncFrom)[0].sync_from().provider().peer_id(), "b");
  fx = Send("c", Held(3, 0x999));
  EXPECT_TRUE(fx.rounds_completed.empty());
  EXPECT_EQ(Events(fx, "c", kSyncFrom).size(), 1u);
  EXPECT_EQ(PeerState("c"), "syncing");
}

TEST_F(DecentralizedResumeTest, ARoundAheadIsNotAdoptedOnceThisCoordinatorOpenedOne) {
  Make(Spec(1, 5));
  AddSynced({"a"});  // round 1 opens
  Add("b");
  ModeEffects fx = Send("b", Held(1, 0x111));
  EXPECT_TRUE(fx.rounds_completed.empty());
  ASSERT_EQ(Events(fx, "b", kSyncFrom).size(), 1u);
  EXPECT_EQ(Events(fx, "b", kSyncFrom)[0].sync_from().round(), 0u);
  EXPECT_EQ(status_.model_version(), 0u);
}

TEST_F(DecentralizedResumeTest, AnAdoptedFinalRoundFinishesTheTask) {
  Restart(Spec(1, 4), 3);
  Add("a");
  ModeEffects fx = Send("a", Held(4, 0x444));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_THAT(Kinds(fx, "a"), IsEmpty()) << "no round after the last one";
  fx = Tick(absl::Seconds(1));
  ASSERT_TRUE(fx.finish.has_value());
  EXPECT_EQ(fx.finish->first, v1::TASK_STATE_COMPLETED);
  EXPECT_EQ(status_.model_version(), 4u);
}

}  // namespace
}  // namespace shoal::coordinator
