// The coordinator's side of stragglers (straggler_factor): a federated-sync peer that keeps
// holding the rounds up moves to asynchronous contribution; the rounds stop waiting for it, it
// is started only while idle and not interrupted while it trains, and its late update goes into
// the round open when it arrives. Driven event by event with a fake clock and aggregator.

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
using Kind = v1::CoordinatorEvent::KindCase;

class CoordinatorStragglersTest : public CoordinatorCoreTest {
 protected:
  static common::v1::TaskSpec StragglerSpec() {
    common::v1::TaskSpec spec = Spec("t", 3, 8);
    spec.set_straggler_factor(2);
    spec.set_straggler_rounds(2);
    return spec;
  }

  // Rounds 1 and 2 wait for c, which takes 5 s against 1 s; then it is async.
  void SlowFirstRounds(std::map<std::string, std::shared_ptr<FakeSink>>& sinks) {
    for (uint64_t round = 1; round <= 2; ++round) {
      for (auto& [id, sink] : sinks) sink->Take();
      ASSERT_EQ(Status("t").round(), round);
      Advance(absl::Seconds(1));
      Accept("t", round, "a");
      Accept("t", round, "b");
      Step();
      EXPECT_EQ(aggregator_.closed.size(), round - 1) << "must wait for c";
      Advance(absl::Seconds(4));
      aggregator_.contributors = {"a", "b", "c"};
      Accept("t", round, "c");
      Step();
    }
  }

  // Advances the clock; every peer heartbeats (they are alive, only slow).
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    v1::PeerMessage heartbeat;
    heartbeat.mutable_heartbeat();
    for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(core_->OnMessage(id, heartbeat).ok());
  }
};

TEST_F(CoordinatorStragglersTest, AStragglerGoesAsyncAndTheRoundsStopWaitingForIt) {
  const common::v1::TaskSpec spec = StragglerSpec();
  auto sinks = StartTask(spec, {"a", "b", "c"});
  SlowFirstRounds(sinks);
  v1::TaskStatus status = Status("t");
  EXPECT_THAT(status.async_peers(), ElementsAre("c"));
  EXPECT_EQ(metrics_->federated_sync.straggler_moves.Add({{"direction", "to_async"}}).Value(), 1);
  // Round 3 expects a and b; c may push late. c is idle, so it was started too, with a longer
  // deadline.
  ASSERT_EQ(aggregator_.opened.size(), 3u);
  EXPECT_THAT(aggregator_.opened[2].expected_peers(), UnorderedElementsAre("a", "b"));
  EXPECT_THAT(aggregator_.opened[2].late_peers(), ElementsAre("c"));
  EXPECT_EQ(aggregator_.opened[2].late_staleness().max_staleness(), 10u);
  ASSERT_EQ(sinks["c"]->events.size(), 2u);  // ModelPublished (round 2), RoundStarted (round 3)
  const v1::RoundStarted& late_start = sinks["c"]->events[1].round_started();
  EXPECT_EQ(late_start.round(), 3u);
  EXPECT_GT(late_start.deadline_unix_ms(),
            absl::ToUnixMillis(clock_.Now() + absl::Seconds(spec.round_deadline_seconds())));
  for (auto& [id, sink] : sinks) sink->Take();

  // Round 3 closes without c; c, training, gets neither the new model nor round 4.
  Advance(absl::Seconds(1));
  aggregator_.contributors = {"a", "b"};
  Accept("t", 3, "a");
  Accept("t", 3, "b");
  Step();
  ASSERT_EQ(aggregator_.closed.size(), 3u);
  EXPECT_THAT(sinks["a"]->Take(), ElementsAre(Kind::kModelPublished, Kind::kRoundStarted));
  EXPECT_THAT(sinks["c"]->Take(), IsEmpty());
  status = Status("t");
  EXPECT_THAT(status.history(2).dropped(), IsEmpty());  // an async peer is not dropped

  // Its late update arrives in round 4 and counts there; then it is started again.
  Advance(absl::Seconds(1));
  Accept("t", 4, "c");
  Accept("t", 4, "a");
  aggregator_.contributors = {"a", "b", "c"};
  Accept("t", 4, "b");
  Step();
  status = Status("t");
  ASSERT_EQ(status.history_size(), 4);
  EXPECT_THAT(status.history(3).late(), ElementsAre("c"));
  EXPECT_THAT(status.history(3).participants(), ElementsAre("a", "b", "c"));
  EXPECT_THAT(sinks["c"]->Take(), ElementsAre(Kind::kModelPublished, Kind::kRoundStarted));
  EXPECT_THAT(aggregator_.opened.back().late_peers(), ElementsAre("c"));
  // Within 2x the median (2 s against 1 s), but once: two in a row bring it back.
  EXPECT_THAT(status.async_peers(), ElementsAre("c"));
}

TEST_F(CoordinatorStragglersTest, ALateUpdateReportedAfterItsRoundClosedStillFreesThePeer) {
  auto sinks = StartTask(StragglerSpec(), {"a", "b", "c"});
  SlowFirstRounds(sinks);
  ASSERT_THAT(Status("t").async_peers(), ElementsAre("c"));
  for (auto& [id, sink] : sinks) sink->Take();
  // The aggregator took c's update into round 3 just before it closed, but the event comes
  // after the close.
  Advance(absl::Seconds(1));
  aggregator_.contributors = {"a", "b", "c"};
  Accept("t", 3, "a");
  Accept("t", 3, "b");
  Step();
  ASSERT_EQ(Status("t").round(), 4u);
  EXPECT_THAT(Status("t").history(2).late(), ElementsAre("c"));
  EXPECT_THAT(sinks["c"]->Take(), IsEmpty());  // still training, as far as we know
  Accept("t", 3, "c");
  Step();
  // Idle again: the next round starts it.
  Advance(absl::Seconds(1));
  aggregator_.contributors = {"a", "b"};
  Accept("t", 4, "a");
  Accept("t", 4, "b");
  Step();
  EXPECT_THAT(sinks["c"]->Take(), ElementsAre(Kind::kModelPublished, Kind::kRoundStarted));
}

// No later round would take an async peer's update: the last round waits for the ones still
// training (within its deadline).
TEST_F(CoordinatorStragglersTest, TheLastRoundWaitsForAsyncPeersStillTraining) {
  common::v1::TaskSpec spec = StragglerSpec();
  spec.set_rounds(3);
  auto sinks = StartTask(spec, {"a", "b", "c"});
  SlowFirstRounds(sinks);
  ASSERT_THAT(Status("t").async_peers(), ElementsAre("c"));
  ASSERT_EQ(Status("t").round(), 3u);
  Advance(absl::Seconds(1));
  aggregator_.contributors = {"a", "b", "c"};
  Accept("t", 3, "a");
  Accept("t", 3, "b");
  Step();
  EXPECT_EQ(aggregator_.closed.size(), 2u) << "c still trains: the last round waits";
  Advance(absl::Seconds(2));
  Step();
  EXPECT_EQ(aggregator_.closed.size(), 2u);
  Accept("t", 3, "c");
  Step();
  ASSERT_EQ(aggregator_.closed.size(), 3u);
  EXPECT_THAT(Status("t").history(2).late(), ElementsAre("c"));
}

TEST_F(CoordinatorStragglersTest, WithoutStragglerFactorNobodyMoves) {
  auto sinks = StartTask(Spec("t", 3, 4), {"a", "b", "c"});
  for (uint64_t round = 1; round <= 3; ++round) {
    Advance(absl::Seconds(1));
    Accept("t", round, "a");
    Accept("t", round, "b");
    Advance(absl::Seconds(9));
    aggregator_.contributors = {"a", "b", "c"};
    Accept("t", round, "c");
    Step();
  }
  EXPECT_THAT(Status("t").async_peers(), IsEmpty());
  EXPECT_THAT(aggregator_.opened.back().late_peers(), IsEmpty());
  EXPECT_THAT(aggregator_.opened.back().expected_peers(), UnorderedElementsAre("a", "b", "c"));
}

}  // namespace
}  // namespace shoal::coordinator
