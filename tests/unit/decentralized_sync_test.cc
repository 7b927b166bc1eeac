// DecentralizedTask's model sync: a peer that holds no model of the last completed round (a late
// joiner, a restarted peer, one holding another model) gets it from a provider that does; failed
// providers, pauses, and a round model that nobody holds any more.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "services/coordinator/modes/decentralized/decentralized_task.h"
#include "tests/unit/decentralized_task_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::shoal::coordinator::decentralized_testing;  // NOLINT: the fixture's helpers

TEST_F(DecentralizedTaskTest, ProviderSelectionAndProviderFailure) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  RunRound(1, {"a", "b"});
  ASSERT_EQ(status_.model_version(), 1u);
  // c and d join late holding the initial model: each gets a provider that completed round 1,
  // spread over the providers.
  Add("c");
  ModeEffects fx = Send("c", Held(0));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kSyncServe));
  EXPECT_EQ(Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), "a");
  Add("d");
  fx = Send("d", Held(0));
  EXPECT_THAT(Kinds(fx, "b"), ElementsAre(kSyncServe));
  EXPECT_EQ(Events(fx, "d", kSyncFrom)[0].sync_from().provider().peer_id(), "b");
  // A SyncDone naming another provider is stale.
  Send("c", Synced(1, "b", true), absl::StatusCode::kFailedPrecondition);
  // The provider fails mid-transfer: another one is chosen.
  fx = Send("c", Synced(1, "a", false));
  EXPECT_EQ(Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), "b");
  EXPECT_EQ(Events(fx, "b", kSyncServe)[0].sync_serve().peer_id(), "c");
  // b crashes: both of its joiners move to a.
  fx = Remove("b");
  EXPECT_EQ(Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), "a");
  EXPECT_EQ(Events(fx, "d", kSyncFrom)[0].sync_from().provider().peer_id(), "a");
  EXPECT_EQ(Events(fx, "a", kSyncServe).size(), 2u);
  // A sync that takes longer than round_deadline_seconds is given to a provider again.
  EXPECT_TRUE(Tick(absl::Seconds(29)).events.empty());
  fx = Tick(absl::Seconds(1));
  EXPECT_EQ(Events(fx, "c", kSyncFrom).size(), 1u);
  EXPECT_EQ(Events(fx, "d", kSyncFrom).size(), 1u);
  // d finishes; it joins the open round 2 with a.
  Send("d", Synced(1, "a", true));
  fx = Send("d", Held(1));
  EXPECT_THAT(Kinds(fx, "d"), ElementsAre(kRoundOpen));
  EXPECT_EQ(metrics_.decentralized.sync_transfers.Value(), 1);
  EXPECT_GE(metrics_.decentralized.sync_failures.Value(), 3);
  EXPECT_EQ(PeerState("c"), "syncing");
  EXPECT_EQ(PeerState("d"), "synced");
}

// Providers that cannot serve the round (each holds another round's model now) are tried again
// after a pause once every one has failed the joiner, not at once: a soak saw a joiner sent to
// the same provider thousands of times a second for a minute.
TEST_F(DecentralizedTaskTest, ProvidersThatAllFailAreTriedAgainAfterAPause) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  RunRound(1, {"a", "b"});
  Add("c");
  ModeEffects fx = Send("c", Held(0));
  ASSERT_EQ(Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), "a");
  fx = Send("c", Synced(1, "a", false));
  ASSERT_EQ(Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), "b");
  fx = Send("c", Synced(1, "b", false));
  ASSERT_EQ(Events(fx, "c", kSyncFrom).size(), 1u) << "a new pass over the providers";
  const std::string again = Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id();
  fx = Send("c", Synced(1, again, false));
  ASSERT_EQ(Events(fx, "c", kSyncFrom).size(), 1u) << "the one not tried in this pass";
  fx = Send("c", Synced(1, Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), false));
  EXPECT_TRUE(Events(fx, "c", kSyncFrom).empty()) << "every provider failed twice in a row";
  EXPECT_TRUE(Events(Tick(absl::Milliseconds(500)), "c", kSyncFrom).empty());
  EXPECT_EQ(Events(Tick(absl::Milliseconds(500)), "c", kSyncFrom).size(), 1u);
}

// The pause is for the round whose providers failed: when the next round completes meanwhile,
// the joiner is sent to one of its providers at once.
TEST_F(DecentralizedTaskTest, ANewRoundEndsThePauseAfterFailedProviders) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  RunRound(1, {"a", "b"});
  Add("c");
  ModeEffects fx = Send("c", Held(0));
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(Events(fx, "c", kSyncFrom).size(), 1u) << "try " << i;
    fx =
        Send("c", Synced(1, Events(fx, "c", kSyncFrom)[0].sync_from().provider().peer_id(), false));
  }
  ASSERT_TRUE(Events(fx, "c", kSyncFrom).empty()) << "paused";
  RunRound(2, {"a", "b"});
  ASSERT_EQ(status_.model_version(), 2u);
  fx = Tick(absl::ZeroDuration());
  ASSERT_EQ(Events(fx, "c", kSyncFrom).size(), 1u);
  EXPECT_EQ(Events(fx, "c", kSyncFrom)[0].sync_from().round(), 2u);
}

// Every peer that held round 1's model leaves with it (a killed peer starts again without it):
// the peers that need it wait for a holder, and after three round deadlines (at least a minute)
// with none the task fails naming the round, instead of waiting for ever. A holder that comes
// back in time ends the wait.
TEST_F(DecentralizedTaskTest, ARoundModelThatNoPeerHoldsAnyMoreFailsTheTask) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  RunRound(1, {"a", "b"});
  ASSERT_EQ(status_.model_version(), 1u);
  Remove("a");
  Remove("b");
  Add("c");
  ModeEffects fx = Send("c", Held(0));
  EXPECT_TRUE(Events(fx, "c", kSyncFrom).empty()) << "no provider";
  EXPECT_FALSE(Tick(absl::ZeroDuration()).finish.has_value());  // the wait starts
  EXPECT_FALSE(Tick(absl::Seconds(89)).finish.has_value());
  // b comes back holding round 1 (it was paused, not killed): c syncs from it, no failure.
  Add("b");
  fx = Send("b", Held(1));
  fx = Tick(absl::Seconds(1));
  EXPECT_EQ(Events(fx, "b", kSyncServe).size(), 1u);
  EXPECT_FALSE(Tick(absl::Seconds(120)).finish.has_value()) << "a holder is present";
  // b goes for good: 90 s (three deadlines of 30 s) later the task fails.
  Remove("b");
  EXPECT_FALSE(Tick(absl::ZeroDuration()).finish.has_value());
  EXPECT_FALSE(Tick(absl::Seconds(89)).finish.has_value());
  fx = Tick(absl::Seconds(1));
  ASSERT_TRUE(fx.finish.has_value());
  EXPECT_EQ(fx.finish->first, v1::TASK_STATE_FAILED);
  EXPECT_THAT(fx.finish->second, HasSubstr("round 1's model is lost"));
  EXPECT_THAT(fx.finish->second, HasSubstr("held last by b"));
  EXPECT_THAT(fx.finish->second, HasSubstr("waiting for it: c"));
  EXPECT_FALSE(Tick(absl::Seconds(100)).finish.has_value()) << "failed once";
}

TEST_F(DecentralizedTaskTest, AModelOfTheRightRoundButAnotherDigestIsSynced) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  RunRound(1, {"a", "b"});  // every participant reported digest 0xabc
  Add("c");
  ModeEffects fx = Send("c", Held(1, 0xdef));
  EXPECT_EQ(Events(fx, "c", kSyncFrom).size(), 1u);
  EXPECT_EQ(PeerState("c"), "syncing");
  Add("e");
  fx = Send("e", Held(1, 0xabc));
  EXPECT_TRUE(Events(fx, "e", kSyncFrom).empty());
  EXPECT_EQ(PeerState("e"), "synced");
}

}  // namespace
}  // namespace shoal::coordinator
