// Aggregator-backed tasks and their aggregators: who pushed comes from the aggregator's watch
// stream, a lost aggregator moves the task to another one (which restores the newest
// checkpoint), a task waits a bounded time when no aggregator is left, and a restarted
// coordinator resumes from the version published last wherever it still is, never naming two
// models with one version number. Driven event by event
// with the scripted aggregator (tests/fakes) and manual executors.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers

constexpr char kA[] = "127.0.0.1:5555";  // StartTask registers this one first
constexpr char kB[] = "127.0.0.1:6666";

// The version the newest InitializeModel among `events` asks for; -1 without one.
int64_t InitialVersionAsked(const std::vector<v1::CoordinatorEvent>& events) {
  int64_t version = -1;
  for (const v1::CoordinatorEvent& e : events) {
    if (e.has_initialize_model()) version = static_cast<int64_t>(e.initialize_model().version());
  }
  return version;
}

class FailoverTest : public CoordinatorCoreTest {
 protected:
  // Both aggregators are alive: they register again (as they do every few seconds).
  void Alive(std::initializer_list<const char*> addresses) {
    for (const char* a : addresses) ASSERT_TRUE(core_->RegisterAggregator(a).ok());
  }
};

// The aggregator accepted a's update and then a was killed: the round does not wait for its
// deadline, and a's update is in the aggregate (the aggregator's accepted set decides).
TEST_F(FailoverTest, PeerKilledAfterItsPushDoesNotHoldTheRound) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a", "b"});
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);
  Accept("t", 1, "a");
  core_->Disconnect("a", sinks["a"].get());  // SIGKILL right after the acknowledgement
  Step();
  EXPECT_TRUE(aggregator_.closed.empty()) << "b has not pushed yet";
  aggregator_.contributors = {"a", "b"};
  Accept("t", 1, "b");
  Step();  // no clock advance: well before the 30 s deadline
  ASSERT_EQ(aggregator_.closed.size(), 1u);
  const v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_THAT(status.history(0).participants(), ElementsAre("a", "b"));
  EXPECT_TRUE(status.history(0).dropped().empty());
}

TEST_F(FailoverTest, LostAggregatorMovesTheTaskAndTheRoundRunsAgainFromTheCheckpoint) {
  ASSERT_TRUE(core_->RegisterAggregator(kA).ok());
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_TRUE(core_->RegisterAggregator(kB).ok());
  EXPECT_EQ(Status("t").aggregator(), kA);
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();  // round 1 closes at A (version 1 checkpointed), round 2 opens there
  ASSERT_EQ(Status("t").round(), 2u);
  ASSERT_EQ(aggregator_.open_addresses.back(), kA);
  sinks["a"]->Take();

  aggregator_.BreakWatches(kA, absl::UnavailableError("connection reset"));  // SIGKILL of A
  Step();
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.aggregator(), kB);
  EXPECT_NE(status.state(), v1::TASK_STATE_FAILED);
  // The peer learns the new address; B gets the members, the newest checkpoint, and round 2.
  std::vector<v1::CoordinatorEvent> events = sinks["a"]->events;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].task_assigned().aggregator_address(), kB);
  EXPECT_EQ(aggregator_.put_addresses.back(), kB);
  EXPECT_EQ(aggregator_.puts.back(), std::make_pair(std::string("t"), uint64_t{1}));
  EXPECT_EQ(aggregator_.open_addresses.back(), kB);
  EXPECT_EQ(aggregator_.opened.back().round(), 2u);
  EXPECT_EQ(aggregator_.opened.back().base_version(), 1u);
  EXPECT_EQ(aggregator_.watch_count("t", kB), 1u);
  EXPECT_EQ(aggregator_.watch_count("t", kA), 0u);

  // The task goes on at B.
  aggregator_.contributors = {"a"};
  Accept("t", 2, "a");
  Step();
  EXPECT_EQ(Status("t").round(), 3u);
  EXPECT_EQ(Status("t").history_size(), 2);
}

TEST_F(FailoverTest, WithoutACheckpointThePeersUploadTheInitialModelAgain) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_TRUE(core_->RegisterAggregator(kB).ok());
  sinks["a"]->Take();
  aggregator_.BreakWatches(kA, absl::UnavailableError("gone"));
  Step();
  EXPECT_EQ(Status("t").aggregator(), kB);
  EXPECT_THAT(sinks["a"]->Take(), ElementsAre(v1::CoordinatorEvent::kTaskAssigned,
                                              v1::CoordinatorEvent::kInitializeModel));
  ASSERT_TRUE(core_->OnMessage("a", Initialized("t")).ok());
  Step();
  EXPECT_EQ(aggregator_.open_addresses.back(), kB);
  EXPECT_EQ(aggregator_.opened.back().round(), 1u);
}

TEST_F(FailoverTest, WithNoAggregatorLeftTheTaskWaitsThenResumes) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.BreakWatches(kA, absl::UnavailableError("gone"));
  Step();
  v1::TaskStatus status = Status("t");
  EXPECT_TRUE(status.aggregator().empty());
  EXPECT_NE(status.state(), v1::TASK_STATE_FAILED);
  EXPECT_THAT(status.message(), HasSubstr("waiting for an aggregator"));
  clock_.Advance(absl::Minutes(5));  // within options_.aggregator_wait (10 min)
  v1::PeerMessage hb;
  hb.mutable_heartbeat();
  ASSERT_TRUE(core_->OnMessage("a", hb).ok());
  Step();
  EXPECT_NE(Status("t").state(), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(core_->RegisterAggregator(kB).ok());  // one comes back
  Step();
  EXPECT_EQ(Status("t").aggregator(), kB);
  ASSERT_TRUE(core_->OnMessage("a", Initialized("t")).ok());
  Step();
  EXPECT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);
}

TEST_F(FailoverTest, WithNoAggregatorForTooLongTheTaskFailsSayingSo) {
  options_.aggregator_wait = absl::Minutes(2);
  Recreate();
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.BreakWatches(kA, absl::UnavailableError("gone"));
  Step();
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(30));
    v1::PeerMessage hb;
    hb.mutable_heartbeat();
    ASSERT_TRUE(core_->OnMessage("a", hb).ok());
    Step();
  }
  const v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_FAILED);
  EXPECT_THAT(status.message(), HasSubstr("no aggregator registered within 2m"));
  EXPECT_THAT(sinks["a"]->Take(), Contains(v1::CoordinatorEvent::kTaskFinished));
}

// An aggregator that stops registering is lost too (no watch stream needs to break).
TEST_F(FailoverTest, SilentAggregatorIsLostAfterItsTtl) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_TRUE(core_->RegisterAggregator(kB).ok());
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(2));
    Alive({kB});  // only B keeps registering
    v1::PeerMessage hb;
    hb.mutable_heartbeat();
    ASSERT_TRUE(core_->OnMessage("a", hb).ok());
    Step();
  }
  EXPECT_EQ(Status("t").aggregator(), kB);
}

// The round that published a version is stored before any peer hears of the version: a
// coordinator killed right after the peers did still knows it. The events wait for the store's
// queue (its thread, not a gRPC thread, writes).
TEST_F(FailoverTest, ARoundIsStoredBeforeItsVersionReachesThePeers) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  sinks["a"]->Take();
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  core_->Step();
  while (calls_.RunAll() > 0) {
  }  // round 1 closes at the aggregator; the store's queue has not run
  EXPECT_THAT(sinks["a"]->Take(), Not(Contains(v1::CoordinatorEvent::kModelPublished)));
  absl::StatusOr<std::vector<v1::RoundSummary>> rounds = store_->LoadRounds("t", 0, 10);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  EXPECT_TRUE(rounds->empty());

  while (store_writes_.RunAll() > 0) {
  }
  rounds = store_->LoadRounds("t", 0, 10);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].model_version(), 1u);
  EXPECT_EQ((*rounds)[0].model_digest(), FakeAggregator::ModelOf(1).Digest());
  EXPECT_THAT(sinks["a"]->Take(), Contains(v1::CoordinatorEvent::kModelPublished));
}

// The coordinator stopped after publishing version 1 and before its checkpoint was written: the
// next one takes version 1 from the aggregator that holds it, and round 1 does not run again.
TEST_F(FailoverTest, ARestartTakesTheVersionPublishedLastFromTheAggregatorHoldingIt) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  aggregator_.get_fails_at = {kA};  // the checkpoint of version 1 does not get written
  Accept("t", 1, "a");
  Step();
  ASSERT_EQ(Status("t").model_version(), 1u);
  ASSERT_TRUE(absl::IsNotFound(store_->GetCheckpoint("t", std::nullopt).status()));

  Recreate();
  aggregator_.get_fails_at.clear();
  aggregator_.gets.clear();
  Alive({kA});
  Step();
  EXPECT_THAT(aggregator_.gets, ElementsAre(std::make_pair(std::string(kA), uint64_t{1})));
  EXPECT_EQ(aggregator_.puts.back(), std::make_pair(std::string("t"), uint64_t{1}));
  v1::TaskStatus t = Status("t");
  EXPECT_EQ(t.model_version(), 1u);
  EXPECT_EQ(t.round(), 1u);
  ASSERT_EQ(t.history_size(), 1);
  absl::StatusOr<StoredCheckpoint> c = store_->GetCheckpoint("t", std::nullopt);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->version, 1u);
  auto a = Join("a");
  Step();
  EXPECT_EQ(aggregator_.opened.back().round(), 2u);
  EXPECT_EQ(aggregator_.opened.back().base_version(), 1u);
}

// After a restart the task's model is restored on another aggregator (the one it used before has
// not registered yet): once restored, the task is freed at the one it used before, which would
// otherwise keep its models for good. Where it is restored on the same one, nothing more is
// freed there than the restore itself does.
TEST_F(FailoverTest, ATaskRestoredElsewhereIsFreedWhereItWasBefore) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();
  ASSERT_EQ(Status("t").model_version(), 1u);

  Recreate();
  aggregator_.released_addresses.clear();
  Alive({kB});
  Step();
  ASSERT_EQ(Status("t").aggregator(), kB);
  EXPECT_THAT(aggregator_.released_addresses, UnorderedElementsAre(kB, kA));
  EXPECT_EQ(Status("t").round(), 1u);

  Recreate();
  aggregator_.released_addresses.clear();
  Alive({kB});
  Step();
  ASSERT_EQ(Status("t").aggregator(), kB);
  EXPECT_THAT(aggregator_.released_addresses, ElementsAre(kB)) << "the restore's own";
}

// An aggregator's registration lists what it holds, and the answer names what to free there:
// what the coordinator's tasks no longer use (an aggregator counted as lost that comes back, one
// a restore has read) and what ended. What a task uses, what a restore may still read and the
// tasks this coordinator does not serve are never named.
TEST_F(FailoverTest, ARegistrationIsToldWhichOfItsTasksToFree) {
  ASSERT_TRUE(core_->RegisterAggregator(kA).ok());
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_TRUE(core_->RegisterAggregator(kB).ok());
  ASSERT_EQ(Status("t").aggregator(), kA);
  EXPECT_THAT(core_->TasksToRelease(kA, {"t", "another coordinator's"}), IsEmpty());
  EXPECT_THAT(core_->TasksToRelease(kB, {"t"}), ElementsAre("t")) << "not one of its aggregators";
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();

  aggregator_.BreakWatches(kA, absl::UnavailableError("stopped"));  // SIGSTOP: counted as lost
  Step();
  ASSERT_EQ(Status("t").aggregator(), kB);
  EXPECT_THAT(core_->TasksToRelease(kA, {"t"}), ElementsAre("t")) << "back after a SIGCONT";
  EXPECT_THAT(core_->TasksToRelease(kB, {"t"}), IsEmpty());

  Recreate();
  EXPECT_THAT(core_->TasksToRelease(kB, {"t"}), IsEmpty()) << "the restore may read it there";
  Alive({kA});
  Step();
  ASSERT_EQ(Status("t").aggregator(), kA);
  EXPECT_THAT(core_->TasksToRelease(kB, {"t"}), ElementsAre("t")) << "restored at A";
  EXPECT_THAT(core_->TasksToRelease(kA, {"t"}), IsEmpty());

  ASSERT_TRUE(core_->StopTask("t").ok());
  EXPECT_THAT(core_->TasksToRelease(kA, {"t", "another coordinator's"}), ElementsAre("t"));
}

// The checkpoint's record is there but its file is not (another coordinator's state directory):
// the version comes from the aggregator instead.
TEST_F(FailoverTest, ACheckpointFileThatCannotBeReadIsTakenFromTheAggregator) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();
  absl::StatusOr<StoredCheckpoint> written = store_->GetCheckpoint("t", 1);
  ASSERT_TRUE(written.ok()) << written.status();
  std::filesystem::remove(written->path);

  Recreate();
  aggregator_.gets.clear();
  Alive({kA});
  Step();
  EXPECT_THAT(aggregator_.gets, ElementsAre(std::make_pair(std::string(kA), uint64_t{1})));
  EXPECT_EQ(aggregator_.puts.back(), std::make_pair(std::string("t"), uint64_t{1}));
  EXPECT_EQ(Status("t").round(), 1u);
  EXPECT_TRUE(std::filesystem::exists(written->path)) << "written again from the aggregator";
}

// Version 2 was published, its checkpoint not written, and the aggregator now holds another
// model under that number (it lost the task and ran it again): it is refused by its digest, the
// checkpoint of version 1 comes back, and as version 3: a peer holding the old version 2 must
// not take the rerun's model for it.
TEST_F(FailoverTest, AVersionLostWithItsAggregatorIsNeverNamedAgain) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();  // version 1, checkpointed
  aggregator_.get_fails_at = {kA};
  Accept("t", 2, "a");
  Step();  // version 2, not checkpointed
  ASSERT_EQ(Status("t").model_version(), 2u);

  Recreate();
  aggregator_.get_fails_at.clear();
  aggregator_.other_models = true;
  Alive({kA});
  Step();
  EXPECT_EQ(aggregator_.puts.back(), std::make_pair(std::string("t"), uint64_t{3}));
  v1::TaskStatus t = Status("t");
  EXPECT_EQ(t.model_version(), 3u);
  EXPECT_EQ(t.round(), 1u);
  EXPECT_EQ(t.history_size(), 1);
  absl::StatusOr<StoredCheckpoint> c = store_->GetCheckpoint("t", std::nullopt);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->version, 3u);
  EXPECT_EQ(c->round, 1u);
  auto a = Join("a");
  Step();
  EXPECT_EQ(aggregator_.opened.back().round(), 2u);
  EXPECT_EQ(aggregator_.opened.back().base_version(), 3u);
}

// Every version is lost (no checkpoint was written, the aggregator holds none): the task starts
// again from its initial model, stored under the number after the last one used, and its rounds
// count from 1 again.
TEST_F(FailoverTest, AnInitialModelAfterEveryVersionWasLostTakesANewNumber) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_EQ(aggregator_.puts.size(), 0u) << "the peer stored the initial model, not the core";
  aggregator_.contributors = {"a"};
  aggregator_.get_fails_at = {kA};
  Accept("t", 1, "a");
  Step();
  ASSERT_EQ(Status("t").model_version(), 1u);

  Recreate();
  Alive({kA});
  auto a = Join("a");
  Step();
  EXPECT_EQ(InitialVersionAsked(a->events), 2);
  ASSERT_TRUE(core_->OnMessage("a", Initialized("t")).ok());
  Step();
  v1::TaskStatus t = Status("t");
  EXPECT_EQ(t.model_version(), 2u);
  EXPECT_EQ(t.history_size(), 0);
  EXPECT_EQ(aggregator_.opened.back().round(), 1u);
  EXPECT_EQ(aggregator_.opened.back().base_version(), 2u);
}

// The coordinator was killed while round 1 closed: the aggregator made version 1, and no round
// or checkpoint names it (no peer heard of it from the coordinator; one may have fetched the
// aggregator's newest). On the restore the aggregator says it held version 1: the initial model
// comes back as version 2, not as version 0 again (soak: a tree task taken over by another
// coordinator named its initial model 0, and its next round's model 1, again).
TEST_F(FailoverTest, AVersionTheAggregatorMadeThatNoRoundNamesIsNotNamedAgain) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);
  Recreate();
  aggregator_.version = 1;  // it closed round 1 as asked; its answer reached nobody
  Alive({kA});
  auto a = Join("a");
  Step();
  EXPECT_EQ(InitialVersionAsked(a->events), 2);
  ASSERT_TRUE(core_->OnMessage("a", Initialized("t")).ok());
  Step();
  EXPECT_EQ(Status("t").model_version(), 2u);
  EXPECT_EQ(aggregator_.opened.back().base_version(), 2u);
}

// The same with a checkpoint: version 1 was published and checkpointed, the coordinator killed
// while round 2 closed (the aggregator made version 2). Version 1 comes back as version 3.
TEST_F(FailoverTest, ACheckpointComesBackAfterTheNewestVersionTheAggregatorMade) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();
  ASSERT_TRUE(store_->GetCheckpoint("t", 1).ok());
  Recreate();
  aggregator_.version = 2;
  Alive({kA});
  Step();
  EXPECT_EQ(aggregator_.puts.back(), std::make_pair(std::string("t"), uint64_t{3}));
  EXPECT_EQ(Status("t").model_version(), 3u);
  EXPECT_EQ(Status("t").round(), 1u);
}

// Each task keeps its newest checkpoints (--keep-checkpoints): older records are forgotten and
// their files deleted, a file still named by a kept record (the same model) stays.
TEST_F(FailoverTest, OnlyTheNewestCheckpointsAreKept) {
  options_.work.keep_checkpoints = 2;
  Recreate();
  auto sinks = StartTask(Spec("t", 1, 10), {"a"});
  aggregator_.contributors = {"a"};
  std::vector<std::string> paths;
  for (uint64_t round = 1; round <= 4; ++round) {
    Accept("t", round, "a");
    Step();
    absl::StatusOr<StoredCheckpoint> c = store_->GetCheckpoint("t", std::nullopt);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_EQ(c->version, round);
    EXPECT_THAT(c->path, HasSubstr("/t-"));
    paths.push_back(c->path);
  }
  absl::StatusOr<std::vector<StoredCheckpoint>> kept = store_->ListCheckpoints("t");
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 2u);
  EXPECT_EQ((*kept)[0].version, 3u);
  EXPECT_EQ((*kept)[1].version, 4u);
  EXPECT_FALSE(std::filesystem::exists(paths[0]));
  EXPECT_FALSE(std::filesystem::exists(paths[1]));
  EXPECT_TRUE(std::filesystem::exists(paths[2]));
  EXPECT_TRUE(std::filesystem::exists(paths[3]));
}

TEST_F(FailoverTest, TasksSpreadOverTheRegisteredAggregators) {
  ASSERT_TRUE(core_->RegisterAggregator(kA).ok());
  ASSERT_TRUE(core_->RegisterAggregator(kB).ok());
  ASSERT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  ASSERT_TRUE(core_->CreateTask(Spec("u", 1, 5)).ok());
  EXPECT_THAT((std::vector<std::string>{Status("t").aggregator(), Status("u").aggregator()}),
              UnorderedElementsAre(kA, kB));
}

}  // namespace
}  // namespace shoal::coordinator
