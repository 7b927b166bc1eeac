// The aggregator's sessions on their own, against a fake host (what AggregatorCore gives them:
// the lock, the version store, the events and the parent): RoundSession and BufferSession
// through the AggregationSession interface, as the core drives them.

#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "services/aggregator/sessions/buffer_session.h"
#include "services/aggregator/sessions/round_session.h"
#include "services/aggregator/sessions/session.h"
#include "tests/testing/fake_clock.h"

namespace shoal::aggregator {
namespace {

using shoal::testing::FakeClock;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr size_t kValues = 4;

std::shared_ptr<const tensor::FlatModel> Model(float value) {
  auto model = std::make_shared<tensor::FlatModel>();
  model->layout = *tensor::ModelLayout::Create({{"w", {kValues}}});
  model->values.assign(kValues, value);
  return model;
}

// Records what the sessions publish, notify and forward; stores versions as the core does.
class FakeHost final : public SessionHost {
 public:
  explicit FakeHost(AggregatorMetrics& metrics) : SessionHost({}, clock_, metrics) {}

  void PublishVersion(TaskState& task, uint64_t version,
                      std::shared_ptr<const tensor::FlatModel> model, uint64_t digest) override {
    task.versions[version] = TaskState::Version{std::move(model), digest};
    task.latest = version;
    published.push_back(version);
  }
  std::vector<float> TakeEvictedBuffer(TaskState&, uint64_t, const tensor::ModelLayout&) override {
    return {};
  }
  void RecycleBuffer(std::vector<float> /*buffer*/) override {}
  void Notify(const std::string&, const v1::TaskEvent& event) override {
    absl::MutexLock lock(&events_mu_);
    events.push_back(event);
  }
  void Forward(const v1::ParentRound& parent, PartialResult aggregate) override {
    absl::MutexLock lock(&events_mu_);
    parents.push_back(parent);
    forwarded.push_back(std::move(aggregate));
  }

  std::vector<uint64_t> published;  // under mu()
  absl::Mutex events_mu_;
  std::vector<v1::TaskEvent> events;
  std::vector<v1::ParentRound> parents;
  std::vector<PartialResult> forwarded;

 private:
  FakeClock clock_;
};

class SessionTest : public ::testing::Test {
 protected:
  SessionTest() : metrics_(registry_), host_(metrics_) {
    task_ = std::make_shared<TaskState>();
    task_->name = "t";
    task_->versions[0] = TaskState::Version{Model(1.0f), 0};
  }

  // What AggregatorCore::Open does with a request.
  absl::Status Open(const OpenRequest& request) {
    absl::StatusOr<std::shared_ptr<AggregationSession>> made = MakeSession(request, host_);
    if (!made.ok()) return made.status();
    absl::MutexLock lock(&host_.mu());
    auto opened = (*made)->Open(*task_, task_->session);
    if (!opened.ok()) return opened.status();
    if (*opened != task_->session) {
      if (task_->session != nullptr) task_->session->Abandon();
      task_->session = *opened;
    }
    return absl::OkStatus();
  }

  // What a push does once its update is decoded: Target, Accept, Fold.
  absl::Status Push(const PushMeta& meta, float value) {
    std::shared_ptr<AggregationSession> session = task_->session;
    PushTarget target;
    {
      absl::MutexLock lock(&host_.mu());
      if (absl::Status s = session->Target(*task_, meta, target); !s.ok()) return s;
      if (target.duplicate) return absl::OkStatus();
      session->StartPushing(meta.peer_id);
    }
    PushedUpdate update;
    update.meta = meta;
    update.values.assign(kValues, value);
    update.sum_squares = kValues * value * value;
    update.staleness_factor = target.staleness_factor;
    Acceptance accepted = session->Accept(*task_, update);
    if (accepted.status.ok() && accepted.fold_pending) session->Fold(task_, update);
    absl::MutexLock lock(&host_.mu());
    session->StopPushing(meta.peer_id);
    return accepted.status;
  }

  std::vector<v1::TaskEvent> Events() {
    absl::MutexLock lock(&host_.events_mu_);
    return host_.events;
  }

  prometheus::Registry registry_;
  AggregatorMetrics metrics_;
  FakeHost host_;
  std::shared_ptr<TaskState> task_;
};

OpenRoundParams Round(uint64_t number, std::vector<std::string> peers) {
  OpenRoundParams params;
  params.task = "t";
  params.round = number;
  params.expected_peers = std::move(peers);
  return params;
}

OpenBufferParams Buffer(uint32_t size) {
  OpenBufferParams params;
  params.task = "t";
  params.async.set_buffer_size(size);
  return params;
}

// ---------------------------------------------------------------------------------------------
// RoundSession

TEST_F(SessionTest, RoundRefusesBadSettingsBeforeTouchingTheTask) {
  OpenRoundParams zero = Round(0, {"a"});
  EXPECT_EQ(MakeSession(zero, host_).status().code(), absl::StatusCode::kInvalidArgument);
  OpenRoundParams both = Round(1, {"a"});
  both.late_peers = {"a"};
  absl::Status s = MakeSession(both, host_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("peer 'a' is both expected and late"));
  EXPECT_EQ(task_->session, nullptr);
}

TEST_F(SessionTest, RoundFoldsItsPeersAndPublishesTheSampleWeightedMean) {
  ASSERT_TRUE(Open(Round(1, {"a", "b"})).ok());
  ASSERT_TRUE(Push(PushMeta{"t", 1, "a", 0, 1, 0.5}, 2.0f).ok());
  ASSERT_TRUE(Push(PushMeta{"t", 1, "b", 0, 3, 0.5}, 6.0f).ok());
  {
    absl::MutexLock lock(&host_.mu());
    v1::WatchStarted started;
    task_->session->Describe(started);
    EXPECT_EQ(started.open_round(), 1u);
    EXPECT_THAT(started.accepted(), ElementsAre("a", "b"));
  }
  absl::StatusOr<RoundResult> closed = task_->session->Close(*task_, 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->version, 1u);
  EXPECT_THAT(closed->contributors, ElementsAre("a", "b"));
  EXPECT_EQ(closed->num_samples, 4u);
  EXPECT_THAT(host_.published, ElementsAre(1u));
  for (float v : task_->versions.at(1).model->values) EXPECT_FLOAT_EQ(v, 1.0f + 5.0f);
  // A repeated close answers the same result; the accepted events were sent.
  EXPECT_EQ(task_->session->Close(*task_, 1)->digest, closed->digest);
  EXPECT_EQ(Events().size(), 2u);
}

TEST_F(SessionTest, RoundTakesOnlyItsExpectedPeersAndNoRoundZero) {
  ASSERT_TRUE(Open(Round(1, {"a"})).ok());
  EXPECT_EQ(Push(PushMeta{"t", 1, "x", 0, 1, 0.5}, 1.0f).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status zero = Push(PushMeta{"t", 0, "a", 0, 1, 0.5}, 1.0f);
  EXPECT_EQ(zero.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(zero.message(), HasSubstr("has no federated-async buffer open"));
  EXPECT_EQ(task_->session->Close(*task_, 2).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionTest, ARepeatedOpenKeepsTheRoundAndANewVersionAbandonsIt) {
  ASSERT_TRUE(Open(Round(1, {"a"})).ok());
  std::shared_ptr<AggregationSession> first = task_->session;
  ASSERT_TRUE(Open(Round(1, {"a", "b"})).ok());
  EXPECT_EQ(task_->session, first) << "a repeat adjusts the open round";
  ASSERT_TRUE(Push(PushMeta{"t", 1, "b", 0, 1, 0.5}, 1.0f).ok()) << "b is expected now";
  {
    absl::MutexLock lock(&host_.mu());
    host_.PublishVersion(*task_, 7, Model(0.0f), 0);  // a restore
    EXPECT_EQ(task_->session->OnNewVersion(*task_), first);
  }
  EXPECT_EQ(task_->session->Close(*task_, 1).status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// BufferSession

TEST_F(SessionTest, ABufferPublishesWhenFullAndTakesNoRounds) {
  ASSERT_TRUE(Open(Buffer(2)).ok());
  ASSERT_TRUE(Push(PushMeta{"t", 0, "a", 0, 1, 0.5}, 2.0f).ok());
  EXPECT_TRUE(host_.published.empty());
  ASSERT_TRUE(Push(PushMeta{"t", 0, "b", 0, 3, 0.5}, 6.0f).ok());
  EXPECT_THAT(host_.published, ElementsAre(1u));
  for (float v : task_->versions.at(1).model->values) EXPECT_FLOAT_EQ(v, 1.0f + 5.0f);
  std::vector<v1::TaskEvent> events = Events();
  ASSERT_EQ(events.size(), 3u);  // two accepted, one published
  EXPECT_THAT(events[2].version_published().contributors(), ElementsAre("a", "b"));

  absl::Status round = Open(Round(2, {"a"}));
  EXPECT_EQ(round.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(round.message(), HasSubstr("federated-async buffer"));
  EXPECT_EQ(Push(PushMeta{"t", 2, "a", 1, 1, 0.5}, 1.0f).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(task_->session->Close(*task_, 2).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionTest, ABufferBelowTheRootForwardsItsAggregateInsteadOfPublishing) {
  OpenBufferParams params = Buffer(2);
  params.parent.set_address("127.0.0.1:1");
  params.parent.set_child("c1");
  ASSERT_TRUE(Open(params).ok());
  ASSERT_TRUE(Push(PushMeta{"t", 0, "a", 0, 1, 0.5}, 2.0f).ok());
  ASSERT_TRUE(Push(PushMeta{"t", 0, "b", 0, 3, 0.5}, 6.0f).ok());
  EXPECT_TRUE(host_.published.empty());
  absl::MutexLock lock(&host_.events_mu_);
  ASSERT_EQ(host_.forwarded.size(), 1u);
  EXPECT_EQ(host_.parents[0].child(), "c1");
  EXPECT_THAT(host_.forwarded[0].meta.contributors, ElementsAre("a", "b"));
  for (float v : host_.forwarded[0].sum.sum) EXPECT_FLOAT_EQ(v, 5.0f);  // the mean delta
}

TEST_F(SessionTest, ARestoreEmptiesARootBufferButNotAForwardingOne) {
  ASSERT_TRUE(Open(Buffer(2)).ok());
  std::shared_ptr<AggregationSession> root = task_->session;
  ASSERT_TRUE(Push(PushMeta{"t", 0, "a", 0, 1, 0.5}, 2.0f).ok());
  absl::MutexLock lock(&host_.mu());
  host_.PublishVersion(*task_, 5, Model(0.0f), 0);
  std::shared_ptr<AggregationSession> next = root->OnNewVersion(*task_);
  EXPECT_NE(next, root) << "a fresh, empty buffer on version 5";
  v1::WatchStarted started;
  next->Describe(started);
  EXPECT_EQ(started.accepted_size(), 0);

  OpenBufferParams params = Buffer(2);
  params.base_version = 5;
  params.parent.set_address("127.0.0.1:1");
  params.parent.set_child("c1");
  auto forwarding = MakeSession(params, host_);
  ASSERT_TRUE(forwarding.ok());
  EXPECT_EQ((*forwarding)->OnNewVersion(*task_), *forwarding);
}

}  // namespace
}  // namespace shoal::aggregator
