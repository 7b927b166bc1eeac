// The coordinator's decentralized round state machine (DecentralizedTask), driven event by event
// with explicit times: every test asserts the events sent to each peer and the task status.

#include "services/coordinator/modes/decentralized/decentralized_task.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "libs/privacy/rdp_accountant.h"
#include "services/coordinator/peer_data.h"
#include "tests/unit/decentralized_task_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using namespace ::shoal::coordinator::decentralized_testing;  // NOLINT: the fixture's helpers

TEST_F(DecentralizedTaskTest, NormalRoundsThenFinalEvaluationCompletes) {
  Make(Spec(2, 2));
  Add("a");
  EXPECT_EQ(PeerState("a"), "new");
  ModeEffects fx = Send("a", Held(0));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kWaiting));
  EXPECT_EQ(status_.state(), v1::TASK_STATE_WAITING);
  Add("b");
  fx = Send("b", Held(0));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kRoundOpen));
  EXPECT_THAT(Kinds(fx, "b"), ElementsAre(kRoundOpen));
  const v1::RoundOpen open = Events(fx, "a", kRoundOpen)[0].round_open();
  EXPECT_EQ(open.round(), 1u);
  EXPECT_EQ(open.round_batches(), 5u);
  EXPECT_EQ(open.ready_deadline_unix_ms(), absl::ToUnixMillis(now_ + absl::Seconds(30)));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_JOINING);
  EXPECT_EQ(status_.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(status_.round(), 1u);
  // A third peer holding the initial model gets the open round at once.
  Add("c");
  fx = Send("c", Held(0));
  EXPECT_THAT(Kinds(fx, "c"), ElementsAre(kRoundOpen));

  for (const char* id : {"a", "b", "c"}) EXPECT_TRUE(Send(id, Join(1)).events.empty());
  EXPECT_EQ(PeerState("a"), "joined");
  now_ += absl::Seconds(10);
  fx = Send("b", Ready(1, 100, 0.4));
  EXPECT_TRUE(fx.events.empty());
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_TRAINING);
  EXPECT_EQ(PeerState("b"), "ready");
  Send("a", Ready(1, 100, 0.6));
  now_ += absl::Seconds(1);
  fx = Send("c", Ready(1, 200, 0.5));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_CONNECTING);
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kPeerList));
    const v1::PeerList list = Events(fx, id, kPeerList)[0].peer_list();
    EXPECT_EQ(list.round(), 1u);
    EXPECT_EQ(list.attempt(), 1u);
    EXPECT_FALSE(list.sharing());
    EXPECT_THAT(Ids(list), ElementsAre("a", "b", "c"));
    EXPECT_EQ(list.participants(0).address(), "127.0.0.1:9097");
  }
  EXPECT_TRUE(Send("a", Report(1, 1, {})).events.empty());
  EXPECT_EQ(PeerState("a"), "connected");
  Send("b", Report(1, 1, {}));
  fx = Send("c", Report(1, 1, {}));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_SHARING);
  EXPECT_EQ(status_.message(), "round 1: sharing with 3 peers");
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kStartSharing));
    EXPECT_EQ(Events(fx, id, kStartSharing)[0].start_sharing().attempt(), 1u);
  }
  Send("a", Shared(1, 1));
  EXPECT_EQ(PeerState("a"), "done");
  EXPECT_EQ(PeerState("b"), "sharing");
  Send("b", Shared(1, 1));
  now_ += absl::Seconds(2);
  fx = Send("c", Shared(1, 1));
  // Round complete: published to the participants, and round 2 opens for them at once.
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  const v1::RoundSummary& r1 = fx.rounds_completed[0];
  EXPECT_EQ(r1.round(), 1u);
  EXPECT_EQ(r1.model_version(), 1u);
  EXPECT_THAT(r1.participants(), ElementsAre("a", "b", "c"));
  EXPECT_EQ(r1.num_samples(), 400u);
  EXPECT_DOUBLE_EQ(r1.mean_train_loss(), (40 + 60 + 100) / 400.0);
  EXPECT_EQ(r1.model_digest(), 0xabcu);
  EXPECT_EQ(r1.joins(), 3u);
  EXPECT_EQ(r1.leaves(), 0u);
  EXPECT_EQ(r1.connection_retries(), 0u);
  EXPECT_EQ(r1.duration_ms(), 13000);
  EXPECT_EQ(r1.overhead_ms(), 3000);
  EXPECT_TRUE(fx.changed);
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_THAT(Kinds(fx, id), ElementsAre(kModelPublished, kRoundOpen));
    EXPECT_EQ(Events(fx, id, kModelPublished)[0].model_published().version(), 1u);
    EXPECT_EQ(Events(fx, id, kRoundOpen)[0].round_open().round(), 2u);
  }
  EXPECT_EQ(status_.model_version(), 1u);
  EXPECT_EQ(status_.round(), 2u);
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_JOINING);
  ASSERT_EQ(status_.peers_size(), 3);
  EXPECT_EQ(status_.peers(0).model_round(), 1u);

  // Round 2 is the last: then the final evaluation.
  fx = RunRound(2, {"a", "b", "c"});
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kModelPublished));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_EVALUATING);
  EXPECT_EQ(status_.model_version(), 2u);
  EXPECT_FALSE(Send("a", Eval(2)).finish.has_value());
  EXPECT_FALSE(Send("b", Eval(1)).finish.has_value()) << "an older version does not count";
  EXPECT_FALSE(Send("b", Eval(2)).finish.has_value());
  fx = Send("c", Eval(2));
  ASSERT_TRUE(fx.finish.has_value());
  EXPECT_EQ(fx.finish->first, v1::TASK_STATE_COMPLETED);
  EXPECT_EQ(fx.finish->second, "completed 2 rounds");
}

TEST_F(DecentralizedTaskTest, FinalEvaluationTimesOut) {
  Make(Spec(1, 1));
  AddSynced({"a", "b"});
  RunRound(1, {"a", "b"});
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_EVALUATING);
  Send("a", Eval(1));
  EXPECT_FALSE(Tick(absl::Seconds(29)).finish.has_value());
  ModeEffects fx = Tick(absl::Seconds(1));
  ASSERT_TRUE(fx.finish.has_value());
  EXPECT_EQ(fx.finish->first, v1::TASK_STATE_COMPLETED);
}

// Each RoundOpen carries a higher offer than the ones before, and a refused JoinRound's
// refusal names the offer it answered: a peer offered the round again after joins re-opened
// can tell the refusal of its first answer from a refusal of its latest.
TEST_F(DecentralizedTaskTest, OffersAreNumberedAndARefusalNamesTheOfferOfItsJoin) {
  Make(Spec(3, 5));
  for (const std::string id : {"a", "b", "c", "d"}) Add(id);
  Send("a", Held(0));
  Send("b", Held(0));
  // Round 1 opens with the third peer; d, synced while joins are open, is offered it too.
  const ModeEffects opened = Send("c", Held(0));
  ModeEffects fx = Send("d", Held(0));
  std::map<std::string, uint64_t> first;
  for (const std::string id : {"a", "b", "c", "d"}) {
    SCOPED_TRACE(id);
    const auto opens = Events(id == "d" ? fx : opened, id, kRoundOpen);
    ASSERT_EQ(opens.size(), 1u);
    first[id] = opens[0].round_open().offer();
    EXPECT_GT(first[id], 0u);
  }
  EXPECT_EQ(std::set<uint64_t>({first["a"], first["b"], first["c"], first["d"]}).size(), 4u);

  // a alone is ready: joins re-open, and b, c and d are offered round 1 again, with higher
  // offers.
  Send("a", Join(1, first["a"]));
  fx = Send("a", Ready(1));
  std::map<std::string, uint64_t> second;
  for (const std::string id : {"b", "c", "d"}) {
    SCOPED_TRACE(id);
    const auto opens = Events(fx, id, kRoundOpen);
    ASSERT_EQ(opens.size(), 1u);
    second[id] = opens[0].round_open().offer();
    EXPECT_GT(second[id], std::max({first["a"], first["b"], first["c"], first["d"]}));
  }

  // b's first answer arrives now and is taken; c answers the second offer; b's ready closes
  // joins again. Both of d's answers come too late, each refused with its own offer.
  Send("b", Join(1, first["b"]));
  Send("c", Join(1, second["c"]));
  Send("b", Ready(1));
  fx = Send("d", Join(1, first["d"]));
  ASSERT_THAT(Kinds(fx, "d"), ElementsAre(kJoinRefused));
  EXPECT_EQ(Events(fx, "d", kJoinRefused)[0].join_refused().offer(), first["d"]);
  fx = Send("d", Join(1, second["d"]));
  ASSERT_THAT(Kinds(fx, "d"), ElementsAre(kJoinRefused));
  EXPECT_EQ(Events(fx, "d", kJoinRefused)[0].join_refused().offer(), second["d"]);
  // b's answer to the second offer: it joined already.
  Send("b", Join(1, second["b"]), absl::StatusCode::kFailedPrecondition);
  fx = Send("c", Ready(1));
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a", "b", "c"));
}

TEST_F(DecentralizedTaskTest, JoinsAfterTheFirstReadyGoToTheNextRound) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  Send("a", Join(1));
  Send("b", Join(1));
  Send("a", Ready(1));
  // c arrives after joins closed: it is synced but gets no RoundOpen; a JoinRound is refused.
  Add("c");
  ModeEffects fx = Send("c", Held(0));
  EXPECT_THAT(Kinds(fx, "c"), IsEmpty());
  fx = Send("c", Join(1));
  ASSERT_THAT(Kinds(fx, "c"), ElementsAre(kJoinRefused));
  EXPECT_EQ(Events(fx, "c", kJoinRefused)[0].join_refused().round(), 1u);
  EXPECT_EQ(PeerState("c"), "synced");
  fx = Send("b", Ready(1));
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a", "b"));
  EXPECT_THAT(Kinds(fx, "c"), IsEmpty());
  Send("a", Report(1, 1, {}));
  Send("b", Report(1, 1, {}));
  Send("a", Shared(1, 1));
  fx = Send("b", Shared(1, 1));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_EQ(fx.rounds_completed[0].joins(), 2u);
  // c now holds a stale model: a provider that completed round 1 serves it.
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kModelPublished, kSyncServe, kRoundOpen));
  EXPECT_THAT(Kinds(fx, "b"), ElementsAre(kModelPublished, kRoundOpen));
  ASSERT_THAT(Kinds(fx, "c"), ElementsAre(kSyncFrom));
  const v1::SyncFrom from = Events(fx, "c", kSyncFrom)[0].sync_from();
  EXPECT_EQ(from.round(), 1u);
  EXPECT_EQ(from.provider().peer_id(), "a");
  EXPECT_EQ(from.provider().address(), "127.0.0.1:9097");
  EXPECT_EQ(Events(fx, "a", kSyncServe)[0].sync_serve().peer_id(), "c");
  EXPECT_EQ(PeerState("c"), "syncing");
  // The sync succeeds; its ModelHeld makes it a member of the open round 2.
  EXPECT_TRUE(Send("c", Synced(1, "a", true)).events.empty());
  EXPECT_EQ(PeerState("c"), "syncing");
  fx = Send("c", Held(1));
  EXPECT_THAT(Kinds(fx, "c"), ElementsAre(kRoundOpen));
  EXPECT_EQ(PeerState("c"), "synced");
  Send("c", Join(2));
  EXPECT_EQ(PeerState("c"), "joined");
}

TEST_F(DecentralizedTaskTest, LeaverBeforeThePeerListDropsOut) {
  Make(Spec(2, 5));
  AddSynced({"a", "b", "c"});
  for (const char* id : {"a", "b", "c"}) Send(id, Join(1));
  Send("a", Ready(1));
  ModeEffects fx = Remove("c");
  EXPECT_TRUE(fx.events.empty());
  fx = Send("b", Ready(1));
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a", "b"));
  Send("a", Report(1, 1, {}));
  Send("b", Report(1, 1, {}));
  Send("a", Shared(1, 1));
  fx = Send("b", Shared(1, 1));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_EQ(fx.rounds_completed[0].leaves(), 1u);
  EXPECT_THAT(fx.rounds_completed[0].dropped(), ElementsAre("c"));
  EXPECT_THAT(fx.rounds_completed[0].participants(), ElementsAre("a", "b"));
}

TEST_F(DecentralizedTaskTest, LeaverAfterThePeerListIsRemovedFromTheNextAttempt) {
  Make(Spec(2, 5));
  AddSynced({"a", "b", "c", "d"});
  for (const char* id : {"a", "b", "c", "d"}) Send(id, Join(1));
  for (const char* id : {"a", "b", "c", "d"}) Send(id, Ready(1));
  // Connecting: d crashes; the rest get a new peer list without it.
  Send("a", Report(1, 1, {}));
  ModeEffects fx = Remove("d");
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kPeerList));
    const v1::PeerList list = Events(fx, id, kPeerList)[0].peer_list();
    EXPECT_EQ(list.attempt(), 2u);
    EXPECT_FALSE(list.sharing());
    EXPECT_THAT(Ids(list), ElementsAre("a", "b", "c"));
  }
  Send("b", Report(1, 1, {}), absl::StatusCode::kFailedPrecondition);  // the old attempt
  for (const char* id : {"a", "b", "c"}) fx = Send(id, Report(1, 2, {}));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kStartSharing));
  // Sharing: c leaves; a and b average again without it (sharing = true).
  Send("a", Shared(1, 2));
  fx = Remove("c");
  for (const char* id : {"a", "b"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kPeerList));
    const v1::PeerList list = Events(fx, id, kPeerList)[0].peer_list();
    EXPECT_EQ(list.attempt(), 3u);
    EXPECT_TRUE(list.sharing());
    EXPECT_THAT(Ids(list), ElementsAre("a", "b"));
  }
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_SHARING);
  Send("b", Shared(1, 2), absl::StatusCode::kFailedPrecondition);
  Send("a", Shared(1, 3, 7));
  fx = Send("b", Shared(1, 3, 7));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_EQ(fx.rounds_completed[0].leaves(), 2u);
  EXPECT_EQ(fx.rounds_completed[0].model_digest(), 7u);
  EXPECT_THAT(fx.rounds_completed[0].participants(), ElementsAre("a", "b"));
  EXPECT_THAT(fx.rounds_completed[0].dropped(), ElementsAre("c", "d"));
}

TEST_F(DecentralizedTaskTest, BelowMinParticipantsWaitsAndRecovers) {
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  Send("a", Join(1));
  Send("b", Join(1));
  Send("a", Ready(1));
  // b leaves: only a is ready, below min_participants -> a waits, joins re-open.
  ModeEffects fx = Remove("b");
  ASSERT_THAT(Kinds(fx, "a"), ElementsAre(kWaiting));
  EXPECT_EQ(Events(fx, "a", kWaiting)[0].waiting().have(), 1u);
  EXPECT_EQ(Events(fx, "a", kWaiting)[0].waiting().need(), 2u);
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_JOINING);
  EXPECT_EQ(status_.round(), 1u);
  EXPECT_THAT(status_.message(), ::testing::HasSubstr("waiting for peers"));
  EXPECT_EQ(PeerState("a"), "ready");
  // A new peer holding the initial model is offered the same round and completes it.
  Add("c");
  fx = Send("c", Held(0));
  ASSERT_THAT(Kinds(fx, "c"), ElementsAre(kRoundOpen));
  EXPECT_EQ(Events(fx, "c", kRoundOpen)[0].round_open().round(), 1u);
  Send("c", Join(1));
  fx = Send("c", Ready(1));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_CONNECTING);
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a", "c"));
  Send("a", Report(1, 1, {}));
  Send("c", Report(1, 1, {}));
  Send("a", Shared(1, 1));
  fx = Send("c", Shared(1, 1));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_THAT(fx.rounds_completed[0].participants(), ElementsAre("a", "c"));

  // Between rounds, too few synced peers: everyone is told to wait, once.
  Make(Spec(3, 5));
  AddSynced({"x"});
  fx = Send("x", Held(0));
  EXPECT_THAT(Kinds(fx, "x"), IsEmpty()) << "the same notice is not repeated";
  EXPECT_EQ(status_.state(), v1::TASK_STATE_WAITING);
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_UNSPECIFIED);
}

TEST_F(DecentralizedTaskTest, ReadyDeadlineRefusesTheLatePeer) {
  Make(Spec(1, 5));
  AddSynced({"a", "b"});
  Send("a", Join(1));
  Send("b", Join(1));
  now_ += absl::Seconds(5);
  Send("a", Ready(1));
  EXPECT_TRUE(Tick(absl::Seconds(24)).events.empty());
  ModeEffects fx = Tick(absl::Seconds(1));  // b's deadline: 30 s after its RoundOpen
  ASSERT_THAT(Kinds(fx, "b"), ElementsAre(kJoinRefused));
  EXPECT_EQ(Events(fx, "b", kJoinRefused)[0].join_refused().reason(), "missed the ready deadline");
  ASSERT_THAT(Kinds(fx, "a"), ElementsAre(kPeerList));
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a"));
  Send("b", Ready(1), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DecentralizedTaskTest, PeersThatAllMissTheirDeadlineAreOfferedTheRoundAgain) {
  // Nobody ready by the deadline (training slower than round_deadline_seconds): joins are still
  // open, and the round is offered again instead of waiting for joins nobody would send.
  Make(Spec(2, 5));
  AddSynced({"a", "b"});
  Send("a", Join(1));
  Send("b", Join(1));
  EXPECT_TRUE(Tick(absl::Seconds(29)).events.empty());
  ModeEffects fx = Tick(absl::Seconds(1));
  for (const char* id : {"a", "b"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kJoinRefused, kRoundOpen)) << id;
    EXPECT_EQ(Events(fx, id, kRoundOpen)[0].round_open().round(), 1u);
  }
  Send("a", Join(1));
  Send("b", Join(1));
  Send("a", Ready(1));
  fx = Send("b", Ready(1));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_CONNECTING);
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a", "b"));
}

TEST_F(DecentralizedTaskTest, ConnectionFailuresRetryThenRemoveTheFailingPeer) {
  Make(Spec(2, 5, /*retries=*/2));
  AddSynced({"a", "b", "x"});
  for (const char* id : {"a", "b", "x"}) Send(id, Join(1));
  for (const char* id : {"a", "b", "x"}) Send(id, Ready(1));
  // x refuses inbound connections: a and b cannot reach it; x reaches them.
  ModeEffects fx;
  for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
    Send("a", Report(1, attempt, {"x"}));
    Send("b", Report(1, attempt, {"x", "nobody"}));
    fx = Send("x", Report(1, attempt, {}));
    if (attempt < 3) {
      // "retry connections": a new peer list with the same participants.
      for (const char* id : {"a", "b", "x"}) {
        ASSERT_THAT(Kinds(fx, id), ElementsAre(kPeerList));
        EXPECT_EQ(Events(fx, id, kPeerList)[0].peer_list().attempt(), attempt + 1);
        EXPECT_THAT(Ids(Events(fx, id, kPeerList)[0].peer_list()), ElementsAre("a", "b", "x"));
      }
      EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_CONNECTING);
    }
  }
  // Retries exhausted: x is removed, a and b retry without it.
  ASSERT_THAT(Kinds(fx, "x"), ElementsAre(kConnectionFailed));
  EXPECT_EQ(Events(fx, "x", kConnectionFailed)[0].connection_failed().round(), 1u);
  for (const char* id : {"a", "b"}) {
    ASSERT_THAT(Kinds(fx, id), ElementsAre(kPeerList));
    EXPECT_EQ(Events(fx, id, kPeerList)[0].peer_list().attempt(), 4u);
    EXPECT_THAT(Ids(Events(fx, id, kPeerList)[0].peer_list()), ElementsAre("a", "b"));
  }
  EXPECT_EQ(PeerState("x"), "synced");
  Send("x", Join(1));  // it may not come back into this round
  Send("a", Report(1, 4, {}));
  fx = Send("b", Report(1, 4, {}));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kStartSharing));
  Send("a", Shared(1, 4));
  fx = Send("b", Shared(1, 4));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_EQ(fx.rounds_completed[0].connection_retries(), 2u);
  EXPECT_THAT(fx.rounds_completed[0].removed(), ElementsAre("x"));
  EXPECT_THAT(fx.rounds_completed[0].participants(), ElementsAre("a", "b"));
  // x is synced before it takes part again.
  EXPECT_THAT(Kinds(fx, "x"), ElementsAre(kSyncFrom));
  EXPECT_EQ(metrics_.decentralized.removed_peers.Value(), 1);
  EXPECT_EQ(metrics_.decentralized.connection_retries.Value(), 2);
  // Round 2 has enough peers without x: it sits out one round, then is offered round 3.
  Send("x", Synced(1, "a", true));
  fx = Send("x", Held(1));
  EXPECT_THAT(Kinds(fx, "x"), IsEmpty());
  fx = RunRound(2, {"a", "b"});
  EXPECT_THAT(Kinds(fx, "x"), ElementsAre(kSyncFrom));
  Send("x", Synced(2, "a", true));
  fx = Send("x", Held(2));
  EXPECT_THAT(Kinds(fx, "x"), ElementsAre(kRoundOpen));
  EXPECT_EQ(Events(fx, "x", kRoundOpen)[0].round_open().round(), 3u);
}

TEST_F(DecentralizedTaskTest, ARemovedPeerNeededForMinParticipantsIsOfferedAtOnce) {
  Make(Spec(3, 5, /*retries=*/0));
  AddSynced({"a", "b", "x"});
  for (const char* id : {"a", "b", "x"}) Send(id, Join(1));
  for (const char* id : {"a", "b", "x"}) Send(id, Ready(1));
  Send("a", Report(1, 1, {"x"}));
  Send("b", Report(1, 1, {"x"}));
  ModeEffects fx = Send("x", Report(1, 1, {}));
  // Only a and b remain: below min_participants, they wait and joins re-open (not for x).
  EXPECT_THAT(Kinds(fx, "x"), ElementsAre(kConnectionFailed));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kWaiting));
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_JOINING);
  // A fourth peer completes round 1; x is synced and, needed for round 2, offered at once.
  Add("y");
  Send("y", Held(0));
  Send("y", Join(1));
  fx = Send("y", Ready(1));
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a", "b", "y"));
  for (const char* id : {"a", "b", "y"}) Send(id, Report(1, 2, {}));
  for (const char* id : {"a", "b"}) Send(id, Shared(1, 2));
  fx = Send("y", Shared(1, 2));
  ASSERT_EQ(fx.rounds_completed.size(), 1u);
  EXPECT_THAT(Kinds(fx, "x"), ElementsAre(kSyncFrom));
  Remove("y");
  Send("x", Synced(1, "a", true));
  fx = Send("x", Held(1));
  EXPECT_THAT(Kinds(fx, "x"), ElementsAre(kRoundOpen));
}

TEST_F(DecentralizedTaskTest, TwoPeersThatCannotReachEachOtherBlameTheTarget) {
  Make(Spec(1, 5, /*retries=*/0));
  AddSynced({"a", "b"});
  Send("a", Join(1));
  Send("b", Join(1));
  Send("a", Ready(1));
  Send("b", Ready(1));
  Send("a", Report(1, 1, {"b"}));
  ModeEffects fx = Send("b", Report(1, 1, {}));
  EXPECT_THAT(Kinds(fx, "b"), ElementsAre(kConnectionFailed));
  ASSERT_THAT(Kinds(fx, "a"), ElementsAre(kPeerList));
  EXPECT_THAT(Ids(Events(fx, "a", kPeerList)[0].peer_list()), ElementsAre("a"));
}

TEST_F(DecentralizedTaskTest, StaleAndForeignMessagesAreRejected) {
  Make(Spec(1, 5));
  AddSynced({"a"});
  Send("a", Ready(1), absl::StatusCode::kFailedPrecondition);  // not joined
  Send("a", Report(1, 1, {}), absl::StatusCode::kFailedPrecondition);
  Send("a", Shared(1, 1), absl::StatusCode::kFailedPrecondition);
  Send("zed", Join(1), absl::StatusCode::kFailedPrecondition);  // not a member
  v1::PeerMessage gossip;
  gossip.set_task("d");
  gossip.mutable_gossip_progress();
  Send("a", gossip, absl::StatusCode::kInvalidArgument);
  ModeEffects fx = Send("a", Join(7));
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kJoinRefused));
  EXPECT_EQ(status_.round(), 1u);
}

// privacy.dp at level sample: each round is charged round_batches DP-SGD steps at batch_size /
// the smallest shard when it opens; the first waits for the peers' data reports; the task ends
// when the next round would pass target_epsilon, once the last model is evaluated.
TEST_F(DecentralizedTaskTest, SampleLevelDpChargesEachRoundAndStopsAtTheBudget) {
  constexpr double kSigma = 1.1;
  auto epsilon_after = [](int rounds) {
    auto accountant = privacy::RdpAccountant::Create();
    EXPECT_TRUE(accountant.ok());
    EXPECT_TRUE(accountant->AddSteps(32.0 / 640, kSigma, 5 * rounds).ok());
    return accountant->Spent(1e-5)->epsilon;
  };
  common::v1::TaskSpec spec = Spec(2, 10);
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_SAMPLE);
  dp.set_clip_norm(1);
  dp.set_noise_multiplier(kSigma);
  dp.set_delta(1e-5);
  dp.set_target_epsilon((epsilon_after(2) + epsilon_after(3)) / 2);  // two rounds fit
  Make(spec);
  Add("a");
  Add("b");
  Send("a", Held(0));
  ModeEffects fx = Send("b", Held(0));
  EXPECT_THAT(Kinds(fx, "a"), IsEmpty());
  EXPECT_EQ(status_.message(), "round 1 waits for every peer's data report");
  v1::DataReport report;
  report.set_train_samples(640);
  ASSERT_TRUE(RecordPeerData(status_, "a", report).ok());
  report.set_train_samples(960);  // the larger shard: a's rate counts
  ASSERT_TRUE(RecordPeerData(status_, "b", report).ok());
  for (uint64_t round = 1; round <= 2; ++round) {
    fx = round == 1 ? Tick(absl::Seconds(1)) : fx;
    EXPECT_THAT(Kinds(fx, "a"), testing::Contains(kRoundOpen)) << round;
    EXPECT_EQ(status_.privacy().rounds(), round);
    EXPECT_EQ(status_.privacy().steps(), 5 * round);
    EXPECT_NEAR(status_.privacy().epsilon(), epsilon_after(static_cast<int>(round)), 1e-9);
    for (const char* id : {"a", "b"}) Send(id, Join(round));
    for (const char* id : {"a", "b"}) Send(id, Ready(round));
    for (const char* id : {"a", "b"}) Send(id, Report(round, 1, {}));
    Send("a", Shared(round, 1));
    fx = Send("b", Shared(round, 1));
    ASSERT_EQ(fx.rounds_completed.size(), 1u) << round;
  }
  // Round 3 would pass the target: nobody is offered it, the last model is evaluated.
  EXPECT_THAT(Kinds(fx, "a"), ElementsAre(kModelPublished));
  EXPECT_EQ(status_.privacy().rounds(), 2u);
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_EVALUATING);
  Send("a", Eval(2));
  fx = Send("b", Eval(2));
  ASSERT_TRUE(fx.finish.has_value());
  EXPECT_EQ(fx.finish->first, v1::TASK_STATE_COMPLETED);
  EXPECT_THAT(fx.finish->second, HasSubstr("privacy budget reached"));
}

// privacy.dp at level peer: each participant adds the noise to the update it serves, so each
// round is one Gaussian mechanism at the task's noise multiplier and sampling rate 1, whoever
// else is in the task (c knows no model yet and is not offered the round).
TEST_F(DecentralizedTaskTest, PeerLevelDpChargesEachRoundAtRateOneAndStopsAtTheBudget) {
  constexpr double kSigma = 2;
  auto epsilon_after = [](int rounds) {
    auto accountant = privacy::RdpAccountant::Create();
    EXPECT_TRUE(accountant.ok());
    EXPECT_TRUE(accountant->AddSteps(1.0, kSigma, rounds).ok());
    return accountant->Spent(1e-5)->epsilon;
  };
  common::v1::TaskSpec spec = Spec(2, 10);
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(common::v1::DP_NOISE_CENTRAL);
  dp.set_clip_norm(1);
  dp.set_noise_multiplier(kSigma);
  dp.set_delta(1e-5);
  dp.set_target_epsilon((epsilon_after(3) + epsilon_after(4)) / 2);  // three rounds fit
  Make(spec);
  Add("c");
  AddSynced({"a", "b"});
  ModeEffects fx;
  for (uint64_t round = 1; round <= 3; ++round) {
    EXPECT_EQ(status_.privacy().rounds(), round);
    EXPECT_EQ(status_.privacy().sampling_rate(), 1.0);
    EXPECT_NEAR(status_.privacy().epsilon(), epsilon_after(static_cast<int>(round)), 1e-9);
    fx = RunRound(round, {"a", "b"});
    ASSERT_EQ(fx.rounds_completed.size(), 1u) << round;
  }
  EXPECT_EQ(status_.privacy().rounds(), 3u);
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_EVALUATING);
  Send("a", Eval(3));
  fx = Send("b", Eval(3));
  ASSERT_TRUE(fx.finish.has_value());
  EXPECT_THAT(fx.finish->second, HasSubstr("privacy budget reached"));
}

}  // namespace
}  // namespace shoal::coordinator
