// The coordinator's round state machine, driven event by event with a fake clock, a fake
// aggregator and fake peer streams. The task store is the real SQLite store in a temp dir.

#include "services/coordinator/coordinator_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"
#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers

TEST_F(CoordinatorCoreTest, FullTaskRunsRoundsAndCompletes) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(Spec("t", 2, 2)).ok());
  auto a = Join("a");
  EXPECT_THAT(a->Take(),
              ElementsAre(v1::CoordinatorEvent::kWelcome, v1::CoordinatorEvent::kTaskAssigned));
  Step();  // SetMembers, then a peer is asked for the initial model
  ASSERT_FALSE(aggregator_.members.empty());
  EXPECT_EQ(aggregator_.members.back().session_tokens().count("a"), 1u);
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kInitializeModel));
  ASSERT_TRUE(core_->OnMessage("a", Initialized("t")).ok());
  // One peer is below min_participants: everyone waits.
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kWaiting));
  EXPECT_EQ(Status("t").state(), v1::TASK_STATE_WAITING);
  auto b = Join("b");
  EXPECT_THAT(b->Take(),
              ElementsAre(v1::CoordinatorEvent::kWelcome, v1::CoordinatorEvent::kTaskAssigned));
  Step();  // runs OpenRound
  ASSERT_EQ(aggregator_.opened.size(), 1u);
  EXPECT_EQ(aggregator_.opened[0].round(), 1u);
  EXPECT_THAT(aggregator_.opened[0].expected_peers(), UnorderedElementsAre("a", "b"));
  EXPECT_EQ(aggregator_.opened[0].aggregation().strategy(), common::v1::AGGREGATION_MEAN);
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kRoundStarted));
  EXPECT_THAT(b->Take(), ElementsAre(v1::CoordinatorEvent::kRoundStarted));
  EXPECT_EQ(Status("t").state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);

  Accept("t", 1, "a");
  Step();
  EXPECT_TRUE(aggregator_.closed.empty()) << "must wait for b";
  aggregator_.contributors = {"a", "b"};
  Accept("t", 1, "b");
  Step();  // closes round 1, checkpoints version 1, opens round 2
  ASSERT_EQ(aggregator_.closed.size(), 1u);
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kModelPublished,
                                     v1::CoordinatorEvent::kRoundStarted));
  ASSERT_TRUE(core_->OnMessage("a", Eval("t", 1, 80, 100)).ok());
  // One of the two peers it was published to reported: the accuracy is not final yet.
  ASSERT_EQ(Status("t").history_size(), 1);
  EXPECT_TRUE(Status("t").history(0).evaluated());
  EXPECT_FALSE(Status("t").history(0).evaluation_complete());
  ASSERT_TRUE(core_->OnMessage("b", Eval("t", 1, 90, 100)).ok());
  v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_TRUE(status.history(0).evaluation_complete());
  EXPECT_THAT(status.history(0).participants(), ElementsAre("a", "b"));
  EXPECT_TRUE(status.history(0).evaluated());
  EXPECT_DOUBLE_EQ(status.history(0).test_accuracy(), 0.85);
  EXPECT_EQ(status.history(0).test_samples(), 200u);
  EXPECT_EQ(status.round(), 2u);
  auto checkpoint = store_->GetCheckpoint("t", std::nullopt);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->version, 1u);
  EXPECT_TRUE(std::filesystem::exists(checkpoint->path));

  // Round 2: b never pushes; the round closes at its deadline and b is dropped from it only.
  b->Take();
  Accept("t", 2, "a");
  aggregator_.contributors = {"a"};
  Step();
  EXPECT_EQ(aggregator_.closed.size(), 1u);
  clock_.Advance(absl::Seconds(31));
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());  // it is alive and registers
  ASSERT_TRUE(core_->OnMessage("a", v1::PeerMessage()).code() ==
              absl::StatusCode::kInvalidArgument);  // an empty message is rejected, a lives on
  ASSERT_TRUE(core_
                  ->OnMessage("b",
                              [] {
                                v1::PeerMessage m;
                                m.mutable_heartbeat();
                                return m;
                              }())
                  .ok());
  Step();
  ASSERT_EQ(aggregator_.closed.size(), 2u);
  status = Status("t");
  ASSERT_EQ(status.history_size(), 2);
  EXPECT_THAT(status.history(1).participants(), ElementsAre("a"));
  EXPECT_THAT(status.history(1).dropped(), ElementsAre("b"));
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_EVALUATING);
  EXPECT_THAT(b->Take(), ElementsAre(v1::CoordinatorEvent::kModelPublished));

  ASSERT_TRUE(core_->OnMessage("a", Eval("t", 2, 90, 100)).ok());
  // b leaves before it reports: the evaluation of version 2 is complete without it.
  EXPECT_FALSE(Status("t").history(1).evaluation_complete());
  core_->Disconnect("b", b.get());
  Step();
  status = Status("t");
  EXPECT_TRUE(status.history(1).evaluation_complete());
  EXPECT_EQ(status.history(1).test_samples(), 100u);
  EXPECT_EQ(status.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_THAT(status.participants(), IsEmpty());
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kModelPublished,
                                     v1::CoordinatorEvent::kTaskFinished));
  // Once before its restore (the task starts afresh there), once when it completed.
  EXPECT_THAT(aggregator_.released, ElementsAre("t", "t"));
}

// A peer is told to call the aggregator (here: upload the initial model) only once the
// aggregator has its session token.
TEST_F(CoordinatorCoreTest, PeersAreSentToTheAggregatorOnlyAfterItKnowsThem) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  Step();  // no checkpoint to restore
  auto a = Join("a");
  EXPECT_THAT(a->Take(),
              ElementsAre(v1::CoordinatorEvent::kWelcome, v1::CoordinatorEvent::kTaskAssigned));
  ASSERT_EQ(calls_.pending(), 1u) << "the SetMembers call";
  calls_.RunAll();
  ASSERT_FALSE(aggregator_.members.empty());
  EXPECT_EQ(aggregator_.members.back().session_tokens().count("a"), 1u);
  EXPECT_THAT(a->Take(), ElementsAre(v1::CoordinatorEvent::kInitializeModel));
}

v1::PeerMessage Error(const std::string& task, const std::string& what) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_error()->set_message(what);
  return m;
}

// A peer that reports an error leaves the task for a while instead of bouncing straight back in;
// when every peer has failed and none is left, the task fails saying why.
TEST_F(CoordinatorCoreTest, PeersThatFailAreHeldOffAndATaskAllOfWhosePeersFailFails) {
  auto sinks = StartTask(Spec("t", 2, 5), {"a", "b"});
  ASSERT_TRUE(core_->OnMessage("a", Error("t", "training diverged")).ok());
  Step();
  EXPECT_THAT(Status("t").participants(), ElementsAre("b")) << "a is not assigned again at once";
  clock_.Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  Step();
  EXPECT_THAT(Status("t").participants(), UnorderedElementsAre("a", "b")) << "after its backoff";
  ASSERT_TRUE(core_->OnMessage("a", Error("t", "training diverged")).ok());
  ASSERT_TRUE(core_->OnMessage("b", Error("t", "training diverged: loss is inf")).ok());
  const v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_FAILED);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("every peer failed"));
  EXPECT_THAT(status.message(), ::testing::HasSubstr("training diverged: loss is inf"));
}

TEST_F(CoordinatorCoreTest, PeersCanOnlyUseTheirCertificatesName) {
  auto sink = std::make_shared<FakeSink>();
  EXPECT_EQ(core_->Connect(Hello("peer-1"), "peer-2", sink).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto id = core_->Connect(Hello(""), "peer-2", sink);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "peer-2");
  EXPECT_TRUE(core_->Connect(Hello("peer-3"), "peer-3", std::make_shared<FakeSink>()).ok());
  EXPECT_EQ(core_->Connect(Hello("x", 4, 4), "", sink).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorCoreTest, RefusesMalformedHellosNamingTheField) {
  auto sink = std::make_shared<FakeSink>();
  const auto refused = [&](const v1::Hello& hello) {
    return core_->Connect(hello, "", sink).status();
  };
  EXPECT_THAT(refused(Hello(std::string(129, 'p'))).message(),
              ::testing::HasSubstr("name longer than 128 characters"));
  v1::Hello many = Hello("a");
  for (size_t i = 0; i <= capacity::kMaxAggregatorRtts; ++i) {
    many.mutable_capacity()->add_aggregator_rtts()->set_address("127.0.0.1:1");
  }
  EXPECT_THAT(refused(many).message(), ::testing::HasSubstr("aggregator round trips, at most"));
  v1::Hello nameless = Hello("a");
  nameless.mutable_capacity()->add_aggregator_rtts();
  EXPECT_EQ(refused(nameless).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused(nameless).message(), ::testing::HasSubstr("without an address"));
  EXPECT_TRUE(core_->Connect(Hello(std::string(128, 'p')), "", sink).ok());
}

TEST_F(CoordinatorCoreTest, JoinTokensGateTasksAndSessionTokensReachTheAggregator) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  common::v1::TaskSpec spec = Spec("secret", 1, 5);
  spec.set_join_token("let-me-in");
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  EXPECT_TRUE(Status("secret").spec().join_token().empty()) << "the token never leaves";

  // Every open task needs a token: a peer without one, or with a wrong one, is refused.
  v1::Hello no_token = Hello("a");
  EXPECT_EQ(core_->Connect(no_token, "", std::make_shared<FakeSink>()).status().code(),
            absl::StatusCode::kUnauthenticated);
  v1::Hello wrong = Hello("a");
  wrong.set_join_token("guess");
  EXPECT_EQ(core_->Connect(wrong, "", std::make_shared<FakeSink>()).status().code(),
            absl::StatusCode::kUnauthenticated);

  v1::Hello right = Hello("a");
  right.set_join_token("let-me-in");
  auto sink = std::make_shared<FakeSink>();
  ASSERT_TRUE(core_->Connect(right, "", sink).ok());
  ASSERT_GE(sink->events.size(), 2u);
  const std::string token = sink->events[0].welcome().session_token();
  EXPECT_EQ(token.size(), 32u);
  ASSERT_EQ(sink->events[1].kind_case(), v1::CoordinatorEvent::kTaskAssigned);
  EXPECT_TRUE(sink->events[1].task_assigned().spec().join_token().empty());
  Step();
  ASSERT_TRUE(core_->OnMessage("a", Initialized("secret")).ok());
  Step();
  ASSERT_EQ(aggregator_.opened.size(), 1u);
  ASSERT_FALSE(aggregator_.members.empty());
  EXPECT_EQ(aggregator_.members.back().session_tokens().at("a"), token);

  // A reconnect gets a new token.
  auto again = std::make_shared<FakeSink>();
  ASSERT_TRUE(core_->Connect(right, "", again).ok());
  EXPECT_NE(again->events[0].welcome().session_token(), token);
}

TEST_F(CoordinatorCoreTest, CrashedPeerDoesNotStallTheRound) {
  auto sinks = StartTask(Spec("t", 2, 5), {"a", "b", "c"});
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);
  Accept("t", 1, "a");
  Accept("t", 1, "b");
  core_->Disconnect("c", sinks["c"].get());  // c's stream broke
  aggregator_.contributors = {"a", "b"};
  Step();
  ASSERT_EQ(aggregator_.closed.size(), 1u) << "closed without waiting for the deadline";
  EXPECT_THAT(Status("t").participants(), UnorderedElementsAre("a", "b"));
  EXPECT_EQ(Status("t").round(), 2u);
  EXPECT_THAT(aggregator_.opened.back().expected_peers(), UnorderedElementsAre("a", "b"));
}

TEST_F(CoordinatorCoreTest, EachContributorsRoundTimeIsKept) {
  auto sinks = StartTask(Spec("t", 2, 5), {"a", "b", "c"});
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_TRAINING);
  clock_.Advance(absl::Milliseconds(1500));
  Accept("t", 1, "b", /*train_ms=*/1200, /*update_bytes=*/5000);
  clock_.Advance(absl::Milliseconds(2500));
  Accept("t", 1, "a", /*train_ms=*/3000, /*update_bytes=*/7000);
  core_->Disconnect("c", sinks["c"].get());  // c crashed: the round closes without it
  aggregator_.contributors = {"a", "b"};
  aggregator_.model_bytes = 860'000;
  Step();
  v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.history_size(), 1);
  const auto& times = status.history(0).peer_times();
  ASSERT_EQ(times.size(), 2);
  EXPECT_EQ(times[0].peer_id(), "a");
  EXPECT_EQ(times[0].ms(), 4000);
  EXPECT_EQ(times[1].peer_id(), "b");
  EXPECT_EQ(times[1].ms(), 1500);
  // With each one's training time and bytes, and the round's bytes.
  EXPECT_EQ(times[0].train_ms(), 3000);
  EXPECT_EQ(times[1].train_ms(), 1200);
  EXPECT_EQ(times[1].update_bytes(), 5000u);
  EXPECT_EQ(status.history(0).update_bytes(), 12'000u);
  EXPECT_EQ(status.history(0).model_bytes(), 860'000u);
  // They are stored with the round.
  Recreate();
  EXPECT_EQ(Status("t").history(0).peer_times_size(), 2);
}

TEST_F(CoordinatorCoreTest, SilentPeerIsDeclaredCrashedAfterMissedHeartbeats) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a", "b"});
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(2));
    v1::PeerMessage hb;
    hb.mutable_heartbeat();
    ASSERT_TRUE(core_->OnMessage("a", hb).ok());
    Step();
  }
  ASSERT_TRUE(sinks["b"]->closed.has_value());
  EXPECT_EQ(sinks["b"]->closed->code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(sinks["a"]->closed.has_value());
  EXPECT_THAT(Status("t").participants(), ElementsAre("a"));
}

// A reconnect storm: the coordinator reads the heartbeats of a few peers only (the others wait
// behind thousands of Hellos). Most peers silent at once is the coordinator's backlog, not a
// mass crash: none is declared crashed until most are heard again.
TEST_F(CoordinatorCoreTest, MostPeersSilentAtOnceAreHeldNotDeclaredCrashed) {
  std::vector<std::string> names;
  for (int i = 0; i < 20; ++i) names.push_back(absl::StrCat("p", i));
  auto sinks = StartTask(Spec("t", 1, 5), names);
  auto beat = [&](int count) {
    v1::PeerMessage hb;
    hb.mutable_heartbeat();
    for (int i = 0; i < count; ++i) ASSERT_TRUE(core_->OnMessage(names[i], hb).ok());
  };
  for (int i = 0; i < 6; ++i) {  // 12 s: twice the silence limit (3 x 2 s)
    clock_.Advance(absl::Seconds(2));
    beat(5);
    Step();
  }
  for (const std::string& name : names) EXPECT_FALSE(sinks[name]->closed.has_value()) << name;
  EXPECT_EQ(Status("t").participants_size(), 20);
  EXPECT_EQ(metrics_->peers_silent_held.Value(), 15);
  // The backlog is read: 12 more are heard; the 3 still silent are declared crashed.
  clock_.Advance(absl::Seconds(2));
  beat(17);
  Step();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(sinks[names[i]]->closed.has_value(), i >= 17) << names[i];
  }
  EXPECT_EQ(Status("t").participants_size(), 17);
  EXPECT_EQ(metrics_->peers_silent_held.Value(), 0);
  EXPECT_EQ(metrics_->peers_crashed.Value(), 3);
}

// A silence that lasts (a split network): held for at most ten silence limits, then the silent
// peers are declared crashed.
TEST_F(CoordinatorCoreTest, AMassSilenceIsHeldForAtMostTenLimits) {
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) names.push_back(absl::StrCat("p", i));
  auto sinks = StartTask(Spec("t", 1, 5), names);
  v1::PeerMessage hb;
  hb.mutable_heartbeat();
  absl::Duration silent_for;
  absl::Duration held_for;
  while (!sinks["p9"]->closed.has_value() && silent_for < absl::Minutes(5)) {
    clock_.Advance(absl::Seconds(1));
    silent_for += absl::Seconds(1);
    ASSERT_TRUE(core_->OnMessage("p0", hb).ok());
    Step();
    if (metrics_->peers_silent_held.Value() > 0) held_for += absl::Seconds(1);
  }
  EXPECT_EQ(held_for, absl::Seconds(60)) << "from the first Step past the 6 s limit";
  for (int i = 1; i < 10; ++i) EXPECT_TRUE(sinks[names[i]]->closed.has_value()) << names[i];
  EXPECT_FALSE(sinks["p0"]->closed.has_value());
}

TEST_F(CoordinatorCoreTest, StaleAndForeignMessagesAreRejected) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  v1::PeerMessage join;
  join.set_task("t");
  join.mutable_join_round()->set_round(1);
  EXPECT_EQ(core_->OnMessage("a", join).code(), absl::StatusCode::kFailedPrecondition)
      << "a decentralized message to a federated-sync task";
  join.set_task("other");
  EXPECT_EQ(core_->OnMessage("a", join).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_->OnMessage("a", Eval("t", 0, 5, 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->OnMessage("nobody", Eval("t", 0, 1, 4)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Status("t").round(), 1u);
}

v1::PeerMessage Data(const std::string& task, uint64_t train, std::vector<uint64_t> histogram) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_data_report()->set_train_samples(train);
  m.mutable_data_report()->set_test_samples(train / 6);
  for (uint64_t count : histogram) m.mutable_data_report()->add_label_histogram(count);
  return m;
}

TEST_F(CoordinatorCoreTest, DataReportsShowInTheStatusUntilThePeerLeavesARunningTask) {
  auto sinks = StartTask(Spec("t", 2, 5), {"a", "b"});
  ASSERT_TRUE(core_->OnMessage("b", Data("t", 30, {10, 20})).ok());
  ASSERT_TRUE(core_->OnMessage("a", Data("t", 6, {6, 0})).ok());
  ASSERT_TRUE(core_->OnMessage("a", Data("t", 5, {2, 3})).ok());  // replaces a's first
  v1::TaskStatus status = Status("t");
  ASSERT_EQ(status.data_size(), 2);
  EXPECT_EQ(status.data(0).peer_id(), "a");  // by peer id
  EXPECT_EQ(status.data(0).train_samples(), 5u);
  EXPECT_THAT(status.data(0).label_histogram(), ElementsAre(2, 3));
  EXPECT_EQ(status.data(1).peer_id(), "b");
  EXPECT_EQ(status.data(1).test_samples(), 5u);
  EXPECT_THAT(status.data(1).label_histogram(), ElementsAre(10, 20));

  // A histogram that does not add up is refused and counted; nothing changes.
  absl::Status bad = core_->OnMessage("a", Data("t", 7, {2, 3}));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "data report: the label histogram does not add up to train_samples 7");
  bad = core_->OnMessage("a", Data("t", 7, {~uint64_t{0}, 8}));  // would wrap around
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status("t").data(0).train_samples(), 5u);

  core_->Disconnect("b", sinks["b"].get());
  Step();
  ASSERT_EQ(Status("t").data_size(), 1);
  EXPECT_EQ(Status("t").data(0).peer_id(), "a");
}

TEST_F(CoordinatorCoreTest, CreateTaskValidatesAndIsIdempotent) {
  common::v1::TaskSpec bad = Spec("t", 1, 5);
  bad.set_round_batches(0);
  absl::StatusOr<v1::TaskStatus> created = core_->CreateTask(bad);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(created.status().message()), ::testing::HasSubstr("round_batches"));
  ASSERT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  EXPECT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  EXPECT_EQ(core_->CreateTask(Spec("t", 2, 5)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core_->GetTaskStatus("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->StopTask("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, AggregatorErrorsRetryThenFailTheTask) {
  options_.mode.max_failures = 3;
  Recreate();
  aggregator_.open_status = absl::InternalError("disk full");
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  for (int i = 0; i < 10 && Status("t").state() != v1::TASK_STATE_FAILED; ++i) {
    clock_.Advance(absl::Seconds(10));
    ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
    v1::PeerMessage hb;
    hb.mutable_heartbeat();
    ASSERT_TRUE(core_->OnMessage("a", hb).ok());
    Step();
  }
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_FAILED);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("disk full"));
  EXPECT_EQ(aggregator_.opened.size(), 3u);
  EXPECT_THAT(sinks["a"]->Take(), ::testing::Contains(v1::CoordinatorEvent::kTaskFinished));
}

// An aggregator that does not answer (while its watch stream stays up and it keeps registering)
// is retried with backoff, never a reason to fail the task.
TEST_F(CoordinatorCoreTest, UnreachableAggregatorIsRetriedWithoutFailingTheTask) {
  options_.mode.max_failures = 3;
  Recreate();
  aggregator_.open_status = absl::UnavailableError("connection refused");
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(10));
    ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
    v1::PeerMessage hb;
    hb.mutable_heartbeat();
    ASSERT_TRUE(core_->OnMessage("a", hb).ok());
    Step();
  }
  EXPECT_NE(Status("t").state(), v1::TASK_STATE_FAILED);
  EXPECT_GE(aggregator_.opened.size(), 10u);
  EXPECT_THAT(Status("t").message(), ::testing::HasSubstr("connection refused"));
}

TEST_F(CoordinatorCoreTest, RestartKeepsTasksAndResumesFromCheckpoint) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();  // round 1 closes -> version 1 checkpointed, round 2 opens
  ASSERT_TRUE(core_->CreateTask(Spec("u", 3, 5)).ok());
  ASSERT_EQ(Status("t").round(), 2u);

  Recreate();  // a new coordinator process on the same state dir
  std::vector<v1::TaskStatus> tasks = core_->ListTasks();
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(Status("t").spec().round_batches(), 10u);
  EXPECT_EQ(Status("t").state(), v1::TASK_STATE_WAITING);

  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:6666").ok());
  Step();  // restores the checkpoint into the aggregator
  ASSERT_EQ(aggregator_.puts.size(), 1u);
  EXPECT_EQ(aggregator_.puts[0], std::make_pair(std::string("t"), uint64_t{1}));
  v1::TaskStatus t = Status("t");
  EXPECT_EQ(t.round(), 1u);  // resumes after the last checkpointed round
  EXPECT_EQ(t.model_version(), 1u);
  ASSERT_EQ(t.history_size(), 1);
  auto a = Join("a");
  Step();
  EXPECT_EQ(aggregator_.opened.back().round(), 2u);
  EXPECT_EQ(aggregator_.opened.back().base_version(), 1u);
}

// A coordinator that stopped while the peers evaluated the last round's model: the next one
// restores it and completes the task once the evaluation's deadline passes, opening no round past
// the last.
TEST_F(CoordinatorCoreTest, ResumedAfterTheLastRoundTheTaskCompletes) {
  auto sinks = StartTask(Spec("t", 1, 1), {"a"});
  aggregator_.contributors = {"a"};
  Accept("t", 1, "a");
  Step();  // round 1 closes -> version 1 is published: the peers evaluate it
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_EVALUATING);
  const size_t opened = aggregator_.opened.size();

  Recreate();
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:6666").ok());
  auto a = Join("a");
  Step();
  v1::TaskStatus t = Status("t");
  EXPECT_EQ(t.model_version(), 1u);
  EXPECT_EQ(t.phase(), v1::ROUND_PHASE_EVALUATING);
  EXPECT_EQ(aggregator_.opened.size(), opened) << "no round past the last";
  clock_.Advance(absl::Seconds(31));  // the spec's round deadline, under final_eval_timeout
  Step();
  t = Status("t");
  EXPECT_EQ(t.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_EQ(t.round(), 1u);
}

// EvalReports are stored in batches by Step() or SaveUnsaved() (one write per round, not one per
// peer); what was reported before a restart is still there after it, complete or not.
TEST_F(CoordinatorCoreTest, EvalReportsSurviveARestartOnceSaved) {
  auto sinks = StartTask(Spec("t", 2, 5), {"a", "b"});
  Accept("t", 1, "a");
  aggregator_.contributors = {"a", "b"};
  Accept("t", 1, "b");
  Step();  // round 1 closes, version 1 is published to a and b
  ASSERT_EQ(Status("t").history_size(), 1);
  ASSERT_TRUE(core_->OnMessage("a", Eval("t", 1, 80, 100)).ok());
  EXPECT_EQ(Status("t").history(0).test_samples(), 100u);
  core_->SaveUnsaved();  // what the server does when it stops (Step() does it too)

  Recreate();
  v1::TaskStatus t = Status("t");
  ASSERT_EQ(t.history_size(), 1);
  EXPECT_TRUE(t.history(0).evaluated());
  EXPECT_FALSE(t.history(0).evaluation_complete());
  EXPECT_EQ(t.history(0).test_samples(), 100u);
  EXPECT_DOUBLE_EQ(t.history(0).test_accuracy(), 0.8);
  EXPECT_THAT(t.history(0).participants(), ElementsAre("a", "b"));
}

// The stored task record never carries the history (rounds are stored one by one), however
// often the task changes.
TEST_F(CoordinatorCoreTest, StoredTaskRecordHasNoHistory) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  for (uint64_t round = 1; round <= 3; ++round) {
    Accept("t", round, "a");
    aggregator_.contributors = {"a"};
    Step();
    ASSERT_TRUE(core_->OnMessage("a", Eval("t", round, 9, 10)).ok());
  }
  Step();
  auto stored = store_->LoadTasks(1000);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].status.history_size(), 0);
  EXPECT_EQ((*stored)[0].history.size(), 3u);
  v1::TaskStatus live = Status("t");
  ASSERT_EQ(live.history_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(live.history(i).evaluation_complete());
    EXPECT_TRUE((*stored)[0].history[i].evaluation_complete()) << i;
  }
}

TEST_F(CoordinatorCoreTest, StopTaskReleasesPeersForTheNextTask) {
  auto sinks = StartTask(Spec("t", 1, 5), {"a"});
  ASSERT_TRUE(core_->CreateTask(Spec("u", 1, 5)).ok());
  sinks["a"]->Take();
  ASSERT_TRUE(core_->StopTask("t").ok());
  EXPECT_EQ(Status("t").state(), v1::TASK_STATE_STOPPED);
  EXPECT_THAT(sinks["a"]->Take(), ElementsAre(v1::CoordinatorEvent::kTaskFinished,
                                              v1::CoordinatorEvent::kTaskAssigned));
  Step();
  EXPECT_THAT(sinks["a"]->Take(), ElementsAre(v1::CoordinatorEvent::kInitializeModel));
  EXPECT_THAT(Status("u").participants(), ElementsAre("a"));
}

TEST_F(CoordinatorCoreTest, WatchersSeeEveryChange) {
  ASSERT_TRUE(core_->CreateTask(Spec("t", 1, 5)).ok());
  std::vector<v1::TaskStatus> seen;
  auto handle = core_->Watch("t", [&](const v1::TaskStatus& s) { seen.push_back(s); });
  ASSERT_TRUE(handle.ok());
  // The watcher writes into `seen`: unregistered on every way out (an ASSERT below included),
  // before `seen` goes.
  absl::Cleanup unwatch = [&] { core_->Unwatch(*handle); };
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_TRUE(core_->StopTask("t").ok());
  EXPECT_EQ(seen.back().state(), v1::TASK_STATE_STOPPED);
  core_->Unwatch(*handle);
  const size_t count = seen.size();
  ASSERT_TRUE(core_->CreateTask(Spec("t2", 1, 5)).ok());
  EXPECT_EQ(seen.size(), count);
  EXPECT_EQ(core_->Watch("missing", [](const v1::TaskStatus&) {}).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shoal::coordinator
