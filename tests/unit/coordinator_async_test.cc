// A federated-async task through the coordinator: the buffer opens once the model is held and
// enough peers are here, every version the aggregator publishes becomes a history entry, a
// checkpoint and an evaluation; after the last one the task completes. Driven with the scripted
// aggregator (tests/fakes) and manual executors.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers

common::v1::TaskSpec AsyncSpec(uint32_t min, uint32_t versions) {
  common::v1::TaskSpec spec = Spec("t", min, versions);
  spec.set_mode(common::v1::MODE_FEDERATED_ASYNC);
  spec.mutable_async()->set_buffer_size(2);
  return spec;
}

class AsyncTest : public CoordinatorCoreTest {
 protected:
  // Registers an aggregator, creates the task and joins `peers`; the first peer uploads the
  // initial model: the buffer is then open.
  std::map<std::string, std::shared_ptr<FakeSink>> Open(const common::v1::TaskSpec& spec,
                                                        std::vector<std::string> peers) {
    EXPECT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
    EXPECT_TRUE(core_->CreateTask(spec).ok());
    std::map<std::string, std::shared_ptr<FakeSink>> sinks;
    for (const auto& p : peers) sinks[p] = Join(p);
    Step();
    EXPECT_TRUE(core_->OnMessage(peers.front(), Initialized("t")).ok());
    Step();
    return sinks;
  }
};

TEST_F(AsyncTest, VersionsFromTheBufferBecomeHistoryCheckpointsAndEvaluations) {
  auto sinks = Open(AsyncSpec(2, 2), {"a", "b"});
  ASSERT_EQ(aggregator_.buffers.size(), 1u);
  const aggregator::v1::OpenBufferRequest& open = aggregator_.buffers[0];
  EXPECT_EQ(open.base_version(), 0u);
  EXPECT_EQ(open.async().buffer_size(), 2u);
  EXPECT_TRUE(open.async().has_max_staleness()) << "defaults are filled in";
  EXPECT_EQ(open.last_version(), 2u);
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_BUFFERING);
  std::vector<v1::CoordinatorEvent> events = sinks["b"]->events;
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().has_train_async());
  EXPECT_EQ(events.back().train_async().round_batches(), 10u);
  sinks["a"]->Take();
  sinks["b"]->Take();

  // No rounds: nothing is opened or closed, the aggregator publishes versions on its own.
  aggregator_.Publish("t", 1, {"a", "b"});
  Step();
  status = Status("t");
  EXPECT_EQ(status.model_version(), 1u);
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).round(), 1u);
  EXPECT_THAT(status.history(0).participants(), ElementsAre("a", "b"));
  EXPECT_GT(status.history(0).completed_unix_ms(), 0);
  EXPECT_THAT(sinks["a"]->Take(), ElementsAre(v1::CoordinatorEvent::kModelPublished));
  auto checkpoint = store_->GetCheckpoint("t", std::nullopt);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->version, 1u);
  EXPECT_TRUE(aggregator_.opened.empty());
  EXPECT_TRUE(aggregator_.closed.empty());

  // A peer reports only version 2: that settles version 1 for it as well.
  aggregator_.Publish("t", 2, {"a", "b"});
  Step();
  EXPECT_EQ(Status("t").phase(), v1::ROUND_PHASE_EVALUATING);
  ASSERT_TRUE(core_->OnMessage("a", Eval("t", 2, 90, 100)).ok());
  ASSERT_TRUE(core_->OnMessage("b", Eval("t", 2, 80, 100)).ok());
  Step();
  status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_TRUE(status.history(0).evaluation_complete()) << "skipped by both peers";
  EXPECT_TRUE(status.history(1).evaluation_complete());
  EXPECT_DOUBLE_EQ(status.history(1).test_accuracy(), 0.85);
  ASSERT_EQ(status.peers_size(), 2);
  EXPECT_EQ(status.peers(0).updates(), 2u);
}

// A coordinator that stopped while the peers evaluated the last version: the next one restores
// that version and completes the task once the evaluation's deadline passes (the peers evaluated
// it before), instead of opening a buffer that would wait for a version past the last.
TEST_F(AsyncTest, ResumedAfterTheLastVersionTheTaskCompletes) {
  auto sinks = Open(AsyncSpec(2, 2), {"a", "b"});
  aggregator_.Publish("t", 1, {"a", "b"});
  Step();
  aggregator_.Publish("t", 2, {"a", "b"});
  Step();
  ASSERT_EQ(Status("t").phase(), v1::ROUND_PHASE_EVALUATING);
  ASSERT_EQ(aggregator_.buffers.size(), 1u);

  Recreate();  // a new coordinator process on the same store
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:6666").ok());
  auto a = Join("a");
  auto b = Join("b");
  Step();
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.model_version(), 2u);
  EXPECT_EQ(status.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_EVALUATING);
  EXPECT_EQ(aggregator_.buffers.size(), 1u) << "no buffer past the last version";
  clock_.Advance(absl::Seconds(31));  // the spec's round deadline, under final_eval_timeout
  Step();
  status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_COMPLETED);
  EXPECT_EQ(status.message(), "published 2 versions");
}

TEST_F(AsyncTest, APeerThatJoinsLaterStartsTrainingAtOnce) {
  auto sinks = Open(AsyncSpec(1, 5), {"a"});
  ASSERT_EQ(aggregator_.buffers.size(), 1u);
  auto c = Join("c");
  Step();  // the aggregator learns c's session token before c is told to push
  EXPECT_THAT(c->Take(),
              ElementsAre(v1::CoordinatorEvent::kWelcome, v1::CoordinatorEvent::kTaskAssigned,
                          v1::CoordinatorEvent::kTrainAsync));
}

TEST_F(AsyncTest, BelowMinParticipantsTheBufferWaits) {
  auto sinks = Open(AsyncSpec(2, 5), {"a"});
  EXPECT_TRUE(aggregator_.buffers.empty());
  EXPECT_EQ(Status("t").state(), v1::TASK_STATE_WAITING);
  auto b = Join("b");
  Step();
  EXPECT_EQ(aggregator_.buffers.size(), 1u);
}

TEST_F(AsyncTest, LostAggregatorReopensTheBufferElsewhereFromTheCheckpoint) {
  auto sinks = Open(AsyncSpec(1, 5), {"a"});
  aggregator_.Publish("t", 1, {"a"});
  Step();
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:6666").ok());
  sinks["a"]->Take();
  aggregator_.BreakWatches("127.0.0.1:5555", absl::UnavailableError("gone"));
  Step();
  EXPECT_EQ(Status("t").aggregator(), "127.0.0.1:6666");
  EXPECT_EQ(aggregator_.puts.back(), std::make_pair(std::string("t"), uint64_t{1}));
  ASSERT_EQ(aggregator_.buffers.size(), 2u);
  EXPECT_EQ(aggregator_.buffers.back().base_version(), 1u);
  EXPECT_THAT(sinks["a"]->Take(),
              ElementsAre(v1::CoordinatorEvent::kTaskAssigned, v1::CoordinatorEvent::kTrainAsync));
}

TEST_F(AsyncTest, BufferRefusedForMemoryFailsTheTaskWithTheAggregatorsMessage) {
  aggregator_.open_status = absl::ResourceExhaustedError("median holds 2 x 1 GB, over 1 GB");
  auto sinks = Open(AsyncSpec(1, 5), {"a"});
  const v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.state(), v1::TASK_STATE_FAILED);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("median holds 2 x 1 GB, over 1 GB"));
  EXPECT_THAT(status.participants(), IsEmpty());
}

// On a tree (topology hierarchical) every node's buffer opens, the root first, each sized by what
// pushes into it; a version reaches the peers once the nodes below the root have fetched it.
TEST_F(AsyncTest, OnATreeEveryNodeBuffersAndVersionsComeDownBeforeThePeersHearOfThem) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7001", {}, "aggregator-0").ok());
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7002", {}, "aggregator-1").ok());
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:7003", {}, "aggregator-2").ok());
  common::v1::TaskSpec spec = AsyncSpec(4, 3);
  spec.mutable_async()->set_buffer_size(4);
  spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
  spec.set_cluster_size(2);
  ASSERT_TRUE(core_->CreateTask(spec).ok());
  std::map<std::string, std::shared_ptr<FakeSink>> sinks;
  for (const char* p : {"a", "b", "c", "d"}) sinks[p] = Join(p);
  Step();
  std::string root;
  for (const auto& [id, sink] : sinks) {
    for (const v1::CoordinatorEvent& e : sink->events) {
      if (e.has_initialize_model()) {
        ASSERT_TRUE(core_->OnMessage(id, Initialized("t")).ok());
        root = e.initialize_model().aggregator_address();
      }
    }
    sink->Take();
  }
  Step();
  ASSERT_EQ(aggregator_.buffers.size(), 3u);
  EXPECT_EQ(aggregator_.buffer_addresses[0], root) << "the root first";
  const aggregator::v1::OpenBufferRequest& top = aggregator_.buffers[0];
  EXPECT_FALSE(top.has_parent());
  EXPECT_THAT(top.children(), ElementsAre("aggregator-1", "aggregator-2"));
  EXPECT_EQ(top.async().buffer_size(), 4u) << "the four peers below it";
  for (size_t i = 1; i < 3; ++i) {
    const aggregator::v1::OpenBufferRequest& node = aggregator_.buffers[i];
    EXPECT_EQ(node.parent().address(), root);
    EXPECT_EQ(node.async().buffer_size(), 2u) << "its cluster's two peers";
    EXPECT_TRUE(node.children().empty());
    EXPECT_EQ(node.last_version(), 3u);
  }
  for (auto& [id, sink] : sinks) {
    EXPECT_THAT(sink->Take(), ElementsAre(v1::CoordinatorEvent::kTrainAsync)) << id;
  }

  // The root publishes: both children fetch the version, then the peers hear of it.
  aggregator_.Publish("t", 1, {"a", "b", "c", "d"});
  Step();
  ASSERT_EQ(aggregator_.pulls.size(), 2u);
  for (const auto& [address, pull] : aggregator_.pulls) {
    EXPECT_NE(address, root);
    EXPECT_EQ(pull.version(), 1u);
    EXPECT_EQ(pull.parent().address(), root);
  }
  EXPECT_THAT(sinks["a"]->Take(), ElementsAre(v1::CoordinatorEvent::kModelPublished));

  // A peer that joins trains once the buffers are opened again for it (sizes included).
  auto e = Join("e");
  Step();
  ASSERT_GT(aggregator_.buffers.size(), 3u);
  const std::vector<v1::CoordinatorEvent::KindCase> kinds = e->Take();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.back(), v1::CoordinatorEvent::kTrainAsync);
  EXPECT_EQ(aggregator_.buffers.back().base_version(), 1u);
  EXPECT_THAT(sinks["a"]->Take(), IsEmpty()) << "those training already are not told again";
}

}  // namespace
}  // namespace shoal::coordinator
