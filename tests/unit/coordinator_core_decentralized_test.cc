// CoordinatorCore with decentralized tasks (a ModeTask, no aggregator), driven event by event
// with a fake clock and fake peer streams; the task store is the real SQLite store in a temp dir.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/coordinator/coordinator_core.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers

common::v1::TaskSpec DecentralizedSpec(const std::string& name, uint32_t min, uint32_t rounds) {
  common::v1::TaskSpec spec = Spec(name, min, rounds);
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_max_connection_retry(3);
  return spec;
}

v1::PeerMessage Held(const std::string& task, uint64_t round) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_model_held()->set_round(round);
  return m;
}

// Runs decentralized round `r` of task "d" through the core with `peers` (RoundOpen received).
void RunDecentralizedRound(CoordinatorCore& core, uint64_t r,
                           const std::vector<std::string>& peers) {
  v1::PeerMessage m;
  for (const auto& p : peers) {
    m.set_task("d");
    m.mutable_join_round()->set_round(r);
    ASSERT_TRUE(core.OnMessage(p, m).ok());
  }
  for (const auto& p : peers) {
    m.set_task("d");
    m.mutable_round_ready()->set_round(r);
    m.mutable_round_ready()->set_num_samples(160);
    m.mutable_round_ready()->set_train_loss(0.7);
    ASSERT_TRUE(core.OnMessage(p, m).ok());
  }
  for (const auto& p : peers) {
    m.set_task("d");
    m.mutable_connections_report()->set_round(r);
    m.mutable_connections_report()->set_attempt(1);
    ASSERT_TRUE(core.OnMessage(p, m).ok());
  }
  for (const auto& p : peers) {
    m.set_task("d");
    m.mutable_sharing_done()->set_round(r);
    m.mutable_sharing_done()->set_attempt(1);
    m.mutable_sharing_done()->set_digest_xxh3(42);
    ASSERT_TRUE(core.OnMessage(p, m).ok());
  }
}

TEST_F(CoordinatorCoreTest, DecentralizedTaskNeedsNoAggregatorAndRoutesPeerMessages) {
  // No aggregator ever registers.
  ASSERT_TRUE(core_->CreateTask(DecentralizedSpec("d", 2, 1)).ok());
  auto a = Join("a");
  ASSERT_EQ(a->events.size(), 2u);
  ASSERT_EQ(a->events[1].kind_case(), v1::CoordinatorEvent::kTaskAssigned);
  EXPECT_EQ(a->events[1].task_assigned().aggregator_address(), "");
  EXPECT_EQ(a->events[1].task_assigned().spec().mode(), common::v1::MODE_DECENTRALIZED);
  a->Take();
  auto b = Join("b");
  b->Take();
  Step();
  EXPECT_TRUE(aggregator_.members.empty());
  v1::TaskStatus status = Status("d");
  EXPECT_THAT(status.participants(), UnorderedElementsAre("a", "b"));
  EXPECT_EQ(status.aggregator(), "");
  ASSERT_EQ(status.peers_size(), 2);
  EXPECT_EQ(status.peers(0).state(), "new");

  // The peers' ModelHeld go to the task's state machine: with two synced peers round 1 opens.
  ASSERT_TRUE(core_->OnMessage("a", Held("d", 0)).ok());
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kWaiting));
  ASSERT_TRUE(core_->OnMessage("b", Held("d", 0)).ok());
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kRoundOpen));
  EXPECT_THAT(b->Take(), ElementsAre(v1::CoordinatorEvent::kRoundOpen));
  status = Status("d");
  EXPECT_EQ(status.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_JOINING);
  EXPECT_EQ(status.round(), 1u);
  // Messages naming another task, or a mode message to a federated task, are rejected.
  EXPECT_EQ(core_->OnMessage("a", Held("other", 0)).code(), absl::StatusCode::kFailedPrecondition);

  RunDecentralizedRound(*core_, 1, {"a", "b"});
  RunWork();  // the round is stored before its version is published
  EXPECT_THAT(a->Take(),
              ElementsAre(v1::CoordinatorEvent::kPeerList, v1::CoordinatorEvent::kStartSharing,
                          v1::CoordinatorEvent::kModelPublished));
  status = Status("d");
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_THAT(status.history(0).participants(), ElementsAre("a", "b"));
  EXPECT_EQ(status.history(0).model_digest(), 42u);
  EXPECT_EQ(status.model_version(), 1u);
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_EVALUATING);

  // EvalReports are credited to the round, then complete the task; nothing is released.
  ASSERT_TRUE(core_->OnMessage("a", Eval("d", 1, 80, 100)).ok());
  EXPECT_EQ(Status("d").state(), v1::TASK_STATE_RUNNING);
  EXPECT_FALSE(Status("d").history(0).evaluation_complete());
  ASSERT_TRUE(core_->OnMessage("b", Eval("d", 1, 90, 100)).ok());
  RunWork();  // the completed evaluation is stored, then the task finishes
  status = Status("d");
  EXPECT_EQ(status.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_TRUE(status.history(0).evaluated());
  EXPECT_TRUE(status.history(0).evaluation_complete());
  EXPECT_DOUBLE_EQ(status.history(0).test_accuracy(), 0.85);
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kTaskFinished));
  EXPECT_THAT(aggregator_.released, IsEmpty());
  EXPECT_TRUE(aggregator_.opened.empty());
  Step();
  EXPECT_THAT(aggregator_.released, IsEmpty());
}

TEST_F(CoordinatorCoreTest, DecentralizedPeerThatReconnectsStartsOver) {
  ASSERT_TRUE(core_->CreateTask(DecentralizedSpec("d", 2, 3)).ok());
  auto a = Join("a");
  auto b = Join("b");
  ASSERT_TRUE(core_->OnMessage("a", Held("d", 0)).ok());
  ASSERT_TRUE(core_->OnMessage("b", Held("d", 0)).ok());
  v1::PeerMessage join;
  join.set_task("d");
  join.mutable_join_round()->set_round(1);
  ASSERT_TRUE(core_->OnMessage("a", join).ok());
  ASSERT_EQ(Status("d").peers(0).state(), "joined");
  // a's stream breaks and it reconnects: TaskAssigned again, and it must announce its model.
  auto again = Join("a");
  ASSERT_TRUE(a->closed.has_value());
  ASSERT_EQ(again->events.size(), 2u);
  EXPECT_EQ(again->events[1].kind_case(), v1::CoordinatorEvent::kTaskAssigned);
  v1::TaskStatus status = Status("d");
  EXPECT_EQ(status.peers(0).state(), "new");
  again->Take();
  ASSERT_TRUE(core_->OnMessage("a", Held("d", 0)).ok());
  EXPECT_THAT(again->Take(), ElementsAre(v1::CoordinatorEvent::kRoundOpen));
  ASSERT_TRUE(core_->OnMessage("a", join).ok());
  EXPECT_EQ(Status("d").peers(0).state(), "joined");
}

TEST_F(CoordinatorCoreTest, ModeMessagesToAFederatedTaskAreRejected) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  EXPECT_EQ(core_->OnMessage("a", Held("t", 0)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Status("t").round(), 1u);
}

TEST_F(CoordinatorCoreTest, DecentralizedTaskResumesAfterRestartAndLosesPeers) {
  ASSERT_TRUE(core_->CreateTask(DecentralizedSpec("d", 1, 3)).ok());
  auto a = Join("a");
  ASSERT_TRUE(core_->OnMessage("a", Held("d", 0)).ok());
  RunDecentralizedRound(*core_, 1, {"a"});
  ASSERT_EQ(Status("d").round(), 2u);

  Recreate();  // a new coordinator process on the same state dir: no checkpoint, no restore
  v1::TaskStatus status = Status("d");
  EXPECT_EQ(status.state(), v1::TASK_STATE_WAITING);
  EXPECT_EQ(status.model_version(), 1u);
  EXPECT_EQ(status.history_size(), 1);
  Step();
  EXPECT_THAT(aggregator_.puts, IsEmpty());

  // a comes back holding round 1: round 2 opens. b arrives with the initial model and is
  // synced from a.
  a = Join("a");
  a->Take();
  ASSERT_TRUE(core_->OnMessage("a", Held("d", 1)).ok());
  ASSERT_EQ(a->events.size(), 1u);
  EXPECT_EQ(a->events[0].round_open().round(), 2u);
  a->Take();
  auto b = Join("b");
  b->Take();
  ASSERT_TRUE(core_->OnMessage("b", Held("d", 0)).ok());
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kSyncServe));
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->events[0].sync_from().provider().peer_id(), "a");

  // a reports an error: it is released from the task and, having failed in it a moment ago,
  // not assigned to it again at once (PeerFailed backoff); b has no provider left.
  v1::PeerMessage error;
  error.set_task("d");
  error.mutable_error()->set_message("out of memory");
  ASSERT_TRUE(core_->OnMessage("a", error).ok());
  EXPECT_THAT(a->Take(), IsEmpty());
  status = Status("d");
  ASSERT_EQ(status.peers_size(), 1);
  EXPECT_EQ(status.peers(0).state(), "syncing");
  // After the backoff (1 s for a first error) it is assigned again; its mode state starts over.
  clock_.Advance(absl::Seconds(1));
  Step();
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kTaskAssigned));
  status = Status("d");
  ASSERT_EQ(status.peers_size(), 2);
  EXPECT_EQ(status.peers(0).state(), "new");
  // a leaves for good.
  v1::PeerMessage leave;
  leave.mutable_leave()->set_reason("bye");
  ASSERT_TRUE(core_->OnMessage("a", leave).ok());
  status = Status("d");
  EXPECT_THAT(status.participants(), ElementsAre("b"));
  ASSERT_EQ(status.peers_size(), 1);
  EXPECT_EQ(status.peers(0).state(), "syncing");

  // b goes silent: declared crashed after missed heartbeats.
  clock_.Advance(absl::Seconds(7));
  Step();
  ASSERT_TRUE(b->closed.has_value());
  status = Status("d");
  EXPECT_THAT(status.participants(), IsEmpty());
  EXPECT_EQ(status.peers_size(), 0);
}

}  // namespace
}  // namespace shoal::coordinator
