// The coordinator's gossip ModeTask driven event by event: waiting below min_participants,
// GossipMembers at start and at every membership change, progress into TaskStatus.peers, a
// RoundSummary per round of the slowest member, completion with the members' evaluations.

#include "services/coordinator/modes/gossip/gossip_task.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <string>
#include <vector>

#include "services/coordinator/coordinator_metrics.h"

namespace shoal::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

class GossipTaskTest : public ::testing::Test {
 protected:
  GossipTaskTest() : metrics_(registry_) {
    auto& spec = *status_.mutable_spec();
    spec.set_name("g");
    spec.set_mode(common::v1::MODE_GOSSIP);
    spec.set_rounds(3);
    spec.set_round_batches(10);
    spec.set_batch_size(32);
    spec.set_min_participants(2);
    task_ = MakeGossipTask(status_, {}, metrics_);
  }

  ModeEffects Add(const std::string& id) {
    ModeEffects fx;
    task_->AddPeer({id, id + ":1"}, now_, status_, fx);
    Apply(fx);
    return fx;
  }
  ModeEffects Remove(const std::string& id) {
    ModeEffects fx;
    task_->RemovePeer(id, "test", now_, status_, fx);
    Apply(fx);
    return fx;
  }
  absl::Status Progress(const std::string& id, uint64_t step, bool done = false,
                        ModeEffects* out = nullptr) {
    v1::PeerMessage m;
    auto& p = *m.mutable_gossip_progress();
    m.set_task("g");
    p.set_step(step);
    p.set_clock(static_cast<double>(step) * 0.9);
    p.set_loss(1.0 / (1 + step));
    p.set_done(done);
    p.set_fetches(step);
    p.set_bytes_pulled(step * 100);
    ModeEffects fx;
    absl::Status s = task_->OnMessage(id, m, now_, status_, fx);
    Apply(fx);
    if (out) *out = fx;
    return s;
  }
  absl::Status Eval(const std::string& id, uint64_t correct, ModeEffects* out = nullptr) {
    v1::PeerMessage m;
    auto& r = *m.mutable_eval_report();
    m.set_task("g");
    r.set_version(3);
    r.set_correct(correct);
    r.set_total(100);
    r.set_loss_sum(50);
    ModeEffects fx;
    absl::Status s = task_->OnMessage(id, m, now_, status_, fx);
    Apply(fx);
    if (out) *out = fx;
    return s;
  }
  void Apply(const ModeEffects& fx) {
    for (const auto& r : fx.rounds_completed) *status_.add_history() = r;
    if (fx.finish) finished_ = fx.finish;
  }
  // The GossipMembers each peer got in `fx`: peer -> member ids.
  static std::map<std::string, std::vector<std::string>> MembersSent(const ModeEffects& fx) {
    std::map<std::string, std::vector<std::string>> out;
    for (const auto& [to, e] : fx.events) {
      if (!e.has_gossip_members()) continue;
      EXPECT_TRUE(e.gossip_members().start());
      std::vector<std::string> ids;
      for (const auto& p : e.gossip_members().peers()) ids.push_back(p.peer_id());
      out[to] = ids;
    }
    return out;
  }
  const v1::PeerProgress* PeerOf(const std::string& id) const {
    for (const auto& p : status_.peers()) {
      if (p.peer_id() == id) return &p;
    }
    return nullptr;
  }

  prometheus::Registry registry_;
  CoordinatorMetrics metrics_;
  v1::TaskStatus status_;
  std::unique_ptr<ModeTask> task_;
  absl::Time now_ = kT0;
  std::optional<std::pair<v1::TaskState, std::string>> finished_;
};

using ::testing::ElementsAre;

TEST_F(GossipTaskTest, WaitsBelowMinParticipantsThenStartsEveryone) {
  ModeEffects fx = Add("a");
  ASSERT_EQ(fx.events.size(), 1u);
  EXPECT_TRUE(fx.events[0].second.has_waiting());
  EXPECT_EQ(fx.events[0].second.waiting().have(), 1u);
  EXPECT_EQ(fx.events[0].second.waiting().need(), 2u);
  EXPECT_EQ(status_.state(), v1::TASK_STATE_WAITING);
  ASSERT_NE(PeerOf("a"), nullptr);
  EXPECT_EQ(PeerOf("a")->state(), "waiting");
  // Progress before the start is refused (unless it announces a finished peer).
  EXPECT_EQ(Progress("a", 10).code(), absl::StatusCode::kFailedPrecondition);

  fx = Add("b");
  auto sent = MembersSent(fx);
  EXPECT_THAT(sent["a"], ElementsAre("a", "b"));
  EXPECT_THAT(sent["b"], ElementsAre("a", "b"));
  EXPECT_EQ(status_.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_GOSSIPING);
  EXPECT_TRUE(fx.changed);
  // A late joiner starts at once; everyone learns the new list. Membership then follows leaves,
  // even below min_participants (gossip does not need a quorum once started).
  fx = Add("c");
  sent = MembersSent(fx);
  EXPECT_EQ(sent.size(), 3u);
  EXPECT_THAT(sent["c"], ElementsAre("a", "b", "c"));
  fx = Remove("a");
  sent = MembersSent(fx);
  EXPECT_EQ(sent.size(), 2u);
  EXPECT_THAT(sent["b"], ElementsAre("b", "c"));
  fx = Remove("b");
  sent = MembersSent(fx);
  EXPECT_THAT(sent["c"], ElementsAre("c"));
}

TEST_F(GossipTaskTest, ProgressRoundsAndCompletion) {
  Add("a");
  Add("b");
  ASSERT_TRUE(Progress("a", 10).ok());
  EXPECT_EQ(status_.history_size(), 0);  // b has not done 10 steps yet
  ASSERT_NE(PeerOf("a"), nullptr);
  EXPECT_EQ(PeerOf("a")->step(), 10u);
  EXPECT_DOUBLE_EQ(PeerOf("a")->clock(), 9.0);
  EXPECT_DOUBLE_EQ(PeerOf("a")->loss(), 1.0 / 11);
  EXPECT_EQ(PeerOf("a")->state(), "training");
  ASSERT_TRUE(Progress("a", 20).ok());
  now_ += absl::Seconds(5);
  ASSERT_TRUE(Progress("b", 20).ok());
  // The slowest member passed rounds 1 and 2 at once.
  ASSERT_EQ(status_.history_size(), 2);
  EXPECT_EQ(status_.history(0).round(), 1u);
  EXPECT_EQ(status_.history(1).model_version(), 2u);
  EXPECT_THAT(status_.history(1).participants(), ElementsAre("a", "b"));
  EXPECT_EQ(status_.history(1).num_samples(), 2u * 10 * 32);
  EXPECT_EQ(status_.model_version(), 2u);
  EXPECT_EQ(status_.round(), 3u);

  // Bad input.
  v1::PeerMessage nan;
  nan.mutable_gossip_progress()->set_clock(std::nan(""));
  ModeEffects fx;
  EXPECT_EQ(task_->OnMessage("a", nan, now_, status_, fx).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Progress("a", 31).code(), absl::StatusCode::kInvalidArgument);  // beyond 3 x 10
  EXPECT_EQ(Progress("zz", 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Eval("a", 50).code(), absl::StatusCode::kFailedPrecondition);  // not done yet

  // a finishes and evaluates; the task waits for b.
  ASSERT_TRUE(Progress("a", 30, true).ok());
  EXPECT_EQ(PeerOf("a")->state(), "done");
  ASSERT_TRUE(Eval("a", 80).ok());
  EXPECT_FALSE(finished_.has_value());
  ASSERT_TRUE(Progress("b", 30, true).ok());
  EXPECT_EQ(status_.phase(), v1::ROUND_PHASE_EVALUATING);
  EXPECT_FALSE(finished_.has_value());
  ASSERT_TRUE(Eval("b", 60).ok());
  ASSERT_TRUE(finished_.has_value());
  EXPECT_EQ(finished_->first, v1::TASK_STATE_COMPLETED);
  ASSERT_EQ(status_.history_size(), 3);
  const v1::RoundSummary& last = status_.history(2);
  EXPECT_EQ(last.model_version(), 3u);
  EXPECT_TRUE(last.evaluated());
  EXPECT_EQ(last.test_samples(), 200u);
  EXPECT_DOUBLE_EQ(last.test_accuracy(), 0.7);
  EXPECT_DOUBLE_EQ(last.test_loss(), 0.5);
}

TEST_F(GossipTaskTest, LeaversDoNotBlockCompletionAndEvalTimesOut) {
  Add("a");
  Add("b");
  Add("c");
  ASSERT_TRUE(Progress("a", 30, true).ok());
  ASSERT_TRUE(Eval("a", 90).ok());
  ASSERT_TRUE(Progress("b", 30, true).ok());
  // c leaves before finishing: only a and b count; b never sends its evaluation.
  Remove("c");
  EXPECT_FALSE(finished_.has_value());
  ModeEffects fx;
  now_ += absl::Seconds(30);
  task_->Tick(now_, status_, fx);
  Apply(fx);
  EXPECT_FALSE(finished_.has_value());
  now_ += absl::Seconds(31);
  fx = ModeEffects{};
  task_->Tick(now_, status_, fx);
  Apply(fx);
  ASSERT_TRUE(finished_.has_value());
  const v1::RoundSummary& last = status_.history(status_.history_size() - 1);
  EXPECT_EQ(last.test_samples(), 100u);  // a's evaluation only
  EXPECT_DOUBLE_EQ(last.test_accuracy(), 0.9);
}

TEST_F(GossipTaskTest, ReconnectedFinishedPeerStaysDone) {
  Add("a");
  Add("b");
  ASSERT_TRUE(Progress("a", 30, true).ok());
  ASSERT_TRUE(Eval("a", 70).ok());
  // a reconnects (the core removes and re-adds it): its runner will not train again.
  Remove("a");
  ModeEffects fx = Add("a");
  EXPECT_EQ(MembersSent(fx).size(), 2u);
  ASSERT_NE(PeerOf("a"), nullptr);
  EXPECT_EQ(PeerOf("a")->state(), "done");
  EXPECT_EQ(PeerOf("a")->step(), 30u);
  ASSERT_TRUE(Progress("b", 30, true).ok());
  ASSERT_TRUE(Eval("b", 70).ok());
  ASSERT_TRUE(finished_.has_value());
}

// After a coordinator restart the task resumes from its stored history; peers that had
// finished announce their result again (their runner re-sends it on the new TaskAssigned).
TEST_F(GossipTaskTest, ResumesAfterRestartWithFinishedPeers) {
  v1::RoundSummary r1;
  r1.set_round(1);
  r1.set_model_version(1);
  *status_.add_history() = r1;
  task_ = MakeGossipTask(status_, {}, metrics_);
  Add("a");
  EXPECT_EQ(status_.model_version(), 1u);
  // a finished before the restart: its result is accepted before the start...
  ASSERT_TRUE(Progress("a", 30, true).ok());
  ASSERT_TRUE(Eval("a", 80).ok());
  // ...but the task waits for min_participants members.
  EXPECT_FALSE(finished_.has_value());
  ModeEffects fx = Add("b");
  EXPECT_EQ(MembersSent(fx).size(), 2u);
  ASSERT_TRUE(Progress("b", 20).ok());
  EXPECT_EQ(status_.history_size(), 2);  // round 2 passed (round 1 was stored)
  EXPECT_EQ(status_.history(1).round(), 2u);
  ASSERT_TRUE(Progress("b", 30, true).ok());
  ASSERT_TRUE(Eval("b", 60).ok());
  ASSERT_TRUE(finished_.has_value());
  EXPECT_EQ(status_.history(status_.history_size() - 1).model_version(), 3u);
}

}  // namespace
}  // namespace shoal::coordinator
