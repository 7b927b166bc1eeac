#include "services/aggregator/aggregator_core.h"

#include <prometheus/registry.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/tensor/frame_codec.h"
#include "tests/testing/joining_thread.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

tensor::ModelLayout Layout() {
  return *tensor::ModelLayout::Create({{"conv.weight", {2, 3}}, {"conv.bias", {2}}, {"fc", {5}}});
}

tensor::FlatModel Filled(std::function<float(size_t)> f, tensor::ModelLayout layout = Layout()) {
  tensor::FlatModel m;
  m.layout = std::move(layout);
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = f(i);
  return m;
}

class AggregatorCoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(4); }

  void Make(int max_pushes) {
    core_.reset();
    metrics_ = std::make_unique<AggregatorMetrics>(registry_);
    AggregatorCoreOptions options;
    options.max_concurrent_pushes = max_pushes;
    auto core = AggregatorCore::Create(options, clock_, *metrics_);
    ASSERT_TRUE(core.ok());
    core_ = *std::move(core);
  }

  PushMeta Meta(const std::string& peer, uint64_t samples, uint64_t round = 1, uint64_t base = 0) {
    return PushMeta{"t", round, peer, base, samples, 0.5};
  }

  // Streams `delta` through a push; returns the push's final status.
  absl::Status PushModel(const PushMeta& meta, const tensor::FlatModel& delta,
                         bool* duplicate = nullptr, size_t drop_last_frames = 0) {
    auto push = core_->BeginPush(meta);
    if (!push.ok()) return push.status();
    if (duplicate) *duplicate = (*push == nullptr);
    if (*push == nullptr) return absl::OkStatus();
    std::vector<common::v1::TensorFrame> frames;
    tensor::FrameEncoder enc(delta, 16);
    common::v1::TensorFrame f;
    while (enc.Next(&f)) frames.push_back(f);
    frames.resize(frames.size() - drop_last_frames);
    for (const auto& frame : frames) {
      absl::Status s = (*push)->AddFrame(frame);
      if (!s.ok()) return s;
    }
    return (*push)->Commit();
  }

  void PutBase() {
    auto put = core_->PutModel("t", 0, Filled([](size_t i) { return 1.0f * i; }));
    ASSERT_TRUE(put.ok()) << put.status();
  }

  void Open(std::vector<std::string> peers, uint64_t round = 1, uint64_t base = 0,
            double max_norm = 0) {
    absl::Status s = core_->OpenRound({"t", round, base, std::move(peers), max_norm});
    ASSERT_TRUE(s.ok()) << s;
  }

  double Rejected(RejectReason r) { return metrics_->RejectedCounter(r).Value(); }
  double TotalRejected() {
    double total = 0;
    for (int i = 0; i < kNumRejectReasons; ++i) total += Rejected(static_cast<RejectReason>(i));
    return total;
  }

  prometheus::Registry registry_;
  FakeClock clock_;
  std::unique_ptr<AggregatorMetrics> metrics_;
  std::unique_ptr<AggregatorCore> core_;
};

TEST_F(AggregatorCoreTest, PutAndGetModel) {
  tensor::FlatModel m = Filled([](size_t i) { return 0.5f * i; });
  auto put = core_->PutModel("t", 0, m);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->version, 0u);
  EXPECT_EQ(put->digest, m.Digest());
  auto got = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->version, 0u);
  EXPECT_EQ(got->model->values, m.values);
  // Idempotent repeat.
  EXPECT_TRUE(core_->PutModel("t", 0, m).ok());
  // Same version, different contents.
  auto other = m;
  other.values[0] = 42;
  EXPECT_EQ(core_->PutModel("t", 0, other).status().code(), absl::StatusCode::kFailedPrecondition);
  // Newer version replaces; older is refused.
  ASSERT_TRUE(core_->PutModel("t", 5, other).ok());
  EXPECT_EQ(core_->PutModel("t", 3, m).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_->GetModel("t", std::nullopt)->version, 5u);
  EXPECT_EQ(core_->GetModel("t", 0)->model->values, m.values);  // previous still held
  EXPECT_EQ(metrics_->model_version.Value(), 5);
  EXPECT_EQ(core_->GetModel("nope", std::nullopt).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->GetModel("t", 4).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AggregatorCoreTest, RoundGivesTheExactWeightedMean) {
  PutBase();
  Open({"a", "b", "c"});
  clock_.Advance(absl::Seconds(7));
  tensor::FlatModel d1 = Filled([](size_t i) { return 1.0f + i; });
  tensor::FlatModel d2 = Filled([](size_t i) { return -2.0f * i; });
  PushMeta m1 = Meta("b", 1);
  m1.train_loss = 1.0;
  PushMeta m2 = Meta("a", 3);
  m2.train_loss = 2.0;
  ASSERT_TRUE(PushModel(m1, d1).ok());
  ASSERT_TRUE(PushModel(m2, d2).ok());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->version, 1u);
  EXPECT_THAT(result->contributors, ElementsAre("a", "b"));
  EXPECT_EQ(result->num_samples, 4u);
  EXPECT_DOUBLE_EQ(result->mean_train_loss, (1.0 + 3 * 2.0) / 4);
  auto model = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->version, 1u);
  EXPECT_EQ(result->digest, model->model->Digest());
  for (size_t i = 0; i < d1.values.size(); ++i) {
    const float want = static_cast<float>(i) + (d1.values[i] * 1 + d2.values[i] * 3) / 4;
    EXPECT_FLOAT_EQ(model->model->values[i], want) << i;
  }
  EXPECT_EQ(metrics_->updates_accepted.Value(), 2);
  EXPECT_EQ(metrics_->rounds_completed.Value(), 1);
  EXPECT_EQ(metrics_->model_version.Value(), 1);
  auto hist = metrics_->round_duration.Collect().histogram;
  EXPECT_EQ(hist.sample_count, 1u);
  EXPECT_DOUBLE_EQ(hist.sample_sum, 7.0);
  // Idempotent close.
  auto again = core_->CloseRound("t", 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->version, 1u);
  EXPECT_EQ(again->digest, result->digest);
  EXPECT_EQ(metrics_->rounds_completed.Value(), 1);
}

TEST_F(AggregatorCoreTest, PushesNeedTheirPeersSessionTokenAndCertificate) {
  PutBase();
  core_->SetMembers("t", {{"a", "token-a"}, {"b", "token-b"}});
  Open({"a", "b"});
  // Downloads need the token too; the coordinator's own calls (no peer id) do not.
  EXPECT_EQ(core_->CheckCaller("t", "a", "guess", "").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(core_->CheckCaller("t", "a", "token-a", "a").ok());
  EXPECT_TRUE(core_->CheckCaller("t", "", "", "coordinator").ok());
  EXPECT_EQ(core_->CheckCaller("t", "", "", "a").code(), absl::StatusCode::kPermissionDenied);
  tensor::FlatModel bad = Filled([](size_t i) { return 100.0f; });
  PushMeta missing = Meta("a", 1);
  EXPECT_EQ(PushModel(missing, bad).code(), absl::StatusCode::kUnauthenticated);
  PushMeta wrong = Meta("a", 1);
  wrong.session_token = "guess";
  EXPECT_EQ(PushModel(wrong, bad).code(), absl::StatusCode::kUnauthenticated);
  PushMeta replayed = Meta("a", 1);  // b's token, replayed as peer a
  replayed.session_token = "token-b";
  EXPECT_EQ(PushModel(replayed, bad).code(), absl::StatusCode::kUnauthenticated);
  PushMeta impostor = Meta("a", 1);  // right token, but b's certificate
  impostor.session_token = "token-a";
  impostor.caller_identity = "b";
  EXPECT_EQ(PushModel(impostor, bad).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Rejected(RejectReason::kUnauthenticated), 4);

  tensor::FlatModel good = Filled([](size_t i) { return 1.0f; });
  PushMeta ok = Meta("a", 1);
  ok.session_token = "token-a";
  ok.caller_identity = "a";
  ASSERT_TRUE(PushModel(ok, good).ok());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->contributors, ElementsAre("a"));
  auto model = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(model.ok());
  for (size_t i = 0; i < good.values.size(); ++i) {
    EXPECT_FLOAT_EQ(model->model->values[i], static_cast<float>(i) + 1.0f) << i;  // no 100s
  }
}

TEST_F(AggregatorCoreTest, DuplicatePushIsAcknowledgedOnce) {
  PutBase();
  Open({"a"});
  tensor::FlatModel d = Filled([](size_t) { return 1.0f; });
  bool dup = true;
  ASSERT_TRUE(PushModel(Meta("a", 2), d, &dup).ok());
  EXPECT_FALSE(dup);
  ASSERT_TRUE(PushModel(Meta("a", 2), d, &dup).ok());
  EXPECT_TRUE(dup);
  EXPECT_EQ(metrics_->updates_accepted.Value(), 1);
  auto result = core_->CloseRound("t", 1);
  EXPECT_EQ(result->num_samples, 2u);
  // A retry after the close is still a duplicate, not an error.
  ASSERT_TRUE(PushModel(Meta("a", 2), d, &dup).ok());
  EXPECT_TRUE(dup);
}

TEST_F(AggregatorCoreTest, BadUpdatesAreRejectedCountedAndNeverFoldedIn) {
  PutBase();
  Open({"good", "bad"}, 1, 0, /*max_norm=*/100);
  tensor::FlatModel good = Filled([](size_t) { return 2.0f; });

  // Unknown task.
  PushMeta unknown = Meta("bad", 1);
  unknown.task = "nope";
  EXPECT_EQ(PushModel(unknown, good).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Rejected(RejectReason::kUnknownTask), 1);
  // Wrong round.
  EXPECT_EQ(PushModel(Meta("bad", 1, 2), good).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Rejected(RejectReason::kRoundNotOpen), 1);
  // Not expected.
  auto s = PushModel(Meta("stranger", 1), good);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("stranger"));
  EXPECT_EQ(Rejected(RejectReason::kUnexpectedPeer), 1);
  // Stale base.
  EXPECT_EQ(PushModel(Meta("bad", 1, 1, 7), good).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Rejected(RejectReason::kStaleBase), 1);
  // Zero weight.
  EXPECT_EQ(PushModel(Meta("bad", 0), good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rejected(RejectReason::kMalformed), 1);
  // Wrong shape.
  tensor::FlatModel shape = Filled(
      [](size_t) { return 1.0f; },
      *tensor::ModelLayout::Create({{"conv.weight", {3, 2}}, {"conv.bias", {2}}, {"fc", {5}}}));
  s = PushModel(Meta("bad", 1), shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("conv.weight"));
  EXPECT_EQ(Rejected(RejectReason::kMalformed), 2);
  // NaN.
  tensor::FlatModel nan = good;
  nan.values[9] = std::numeric_limits<float>::quiet_NaN();
  s = PushModel(Meta("bad", 1), nan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("fc"));
  EXPECT_EQ(Rejected(RejectReason::kNonFinite), 1);
  // Norm above the bound.
  tensor::FlatModel big = Filled([](size_t) { return 50.0f; });
  s = PushModel(Meta("bad", 1), big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("norm"));
  EXPECT_EQ(Rejected(RejectReason::kNormBound), 1);
  // Truncated.
  s = PushModel(Meta("bad", 1), good, nullptr, /*drop_last_frames=*/1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rejected(RejectReason::kIncomplete), 1);
  EXPECT_EQ(TotalRejected(), 9);

  ASSERT_TRUE(PushModel(Meta("good", 5), good).ok());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok());
  EXPECT_THAT(result->contributors, ElementsAre("good"));
  auto model = core_->GetModel("t", std::nullopt);
  for (size_t i = 0; i < good.values.size(); ++i) {
    EXPECT_FLOAT_EQ(model->model->values[i], static_cast<float>(i) + 2.0f);
  }
  // Closed round.
  EXPECT_EQ(PushModel(Meta("bad", 1), good).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Rejected(RejectReason::kRoundNotOpen), 2);
  EXPECT_EQ(metrics_->updates_accepted.Value(), 1);
  EXPECT_EQ(metrics_->pushes_in_flight.Value(), 0);
}

TEST_F(AggregatorCoreTest, RoundWithoutContributorsKeepsTheVersion) {
  PutBase();
  Open({"a"});
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->version, 0u);
  EXPECT_TRUE(result->contributors.empty());
  EXPECT_EQ(result->digest, core_->GetModel("t", std::nullopt)->model->Digest());
  // The next round opens on the same version.
  Open({"a"}, 2, 0);
  EXPECT_EQ(core_->CloseRound("t", 7).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->CloseRound("nope", 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AggregatorCoreTest, OpenRoundRules) {
  EXPECT_EQ(core_->OpenRound({"t", 1, 0, {"a"}, 0}).code(), absl::StatusCode::kNotFound);
  PutBase();
  EXPECT_EQ(core_->OpenRound({"t", 0, 0, {"a"}, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->OpenRound({"t", 1, 3, {"a"}, 0}).code(), absl::StatusCode::kFailedPrecondition);
  Open({"a"});
  Open({"a", "b"});  // idempotent; widens the expected set
  ASSERT_TRUE(PushModel(Meta("b", 1), Filled([](size_t) { return 1.0f; })).ok());
  ASSERT_TRUE(core_->CloseRound("t", 1).ok());
  EXPECT_EQ(core_->OpenRound({"t", 1, 0, {"a"}, 0}).code(),
            absl::StatusCode::kFailedPrecondition);  // closed
  // Version 0 is held but no longer the latest.
  EXPECT_EQ(core_->OpenRound({"t", 2, 0, {"a"}, 0}).code(), absl::StatusCode::kFailedPrecondition);
  Open({"a"}, 2, 1);
}

TEST_F(AggregatorCoreTest, KeepsCurrentAndPreviousVersions) {
  PutBase();
  tensor::FlatModel d = Filled([](size_t) { return 1.0f; });
  for (uint64_t r = 1; r <= 3; ++r) {
    Open({"a"}, r, r - 1);
    ASSERT_TRUE(PushModel(Meta("a", 1, r, r - 1), d).ok());
    ASSERT_EQ(core_->CloseRound("t", r)->version, r);
  }
  EXPECT_TRUE(core_->GetModel("t", 3).ok());
  EXPECT_TRUE(core_->GetModel("t", 2).ok());
  EXPECT_EQ(core_->GetModel("t", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FLOAT_EQ(core_->GetModel("t", 3)->model->values[4], 4.0f + 3.0f);
}

TEST_F(AggregatorCoreTest, StagingIsBoundedAndReleased) {
  Make(1);
  PutBase();
  Open({"a", "b"});
  auto first = core_->BeginPush(Meta("a", 1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(metrics_->pushes_in_flight.Value(), 1);
  auto second = core_->BeginPush(Meta("b", 1));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Rejected(RejectReason::kBusy), 1);
  EXPECT_EQ(core_->AcquireStaging().status().code(), absl::StatusCode::kResourceExhausted);
  first->reset();  // abandoned mid-stream: counted as incomplete, buffer returned
  EXPECT_EQ(Rejected(RejectReason::kIncomplete), 1);
  EXPECT_EQ(metrics_->pushes_in_flight.Value(), 0);
  EXPECT_TRUE(PushModel(Meta("b", 1), Filled([](size_t) { return 1.0f; })).ok());
}

TEST_F(AggregatorCoreTest, ConcurrentPushFromTheSamePeerIsAborted) {
  PutBase();
  Open({"a"});
  auto first = core_->BeginPush(Meta("a", 1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(core_->BeginPush(Meta("a", 1)).status().code(), absl::StatusCode::kAborted);
}

TEST_F(AggregatorCoreTest, PushThatOutlivesItsRoundIsNotFoldedIn) {
  PutBase();
  Open({"a", "b"});
  tensor::FlatModel d = Filled([](size_t) { return 1.0f; });
  auto push = core_->BeginPush(Meta("a", 1));
  ASSERT_TRUE(push.ok());
  tensor::FrameEncoder enc(d);
  common::v1::TensorFrame f;
  while (enc.Next(&f)) ASSERT_TRUE((*push)->AddFrame(f).ok());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->contributors.empty());
  EXPECT_EQ((*push)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Rejected(RejectReason::kRoundNotOpen), 1);
  EXPECT_EQ(core_->GetModel("t", std::nullopt)->version, 0u);
}

// Streams `delta` into a fresh push and accepts it, without folding.
std::unique_ptr<AggregatorCore::Push> AcceptedPush(AggregatorCore& core, const PushMeta& meta,
                                                   const tensor::FlatModel& delta) {
  auto push = core.BeginPush(meta);
  EXPECT_TRUE(push.ok()) << push.status();
  if (!push.ok() || *push == nullptr) return nullptr;
  tensor::FrameEncoder enc(delta, 16);
  common::v1::TensorFrame f;
  while (enc.Next(&f)) EXPECT_TRUE((*push)->AddFrame(f).ok());
  EXPECT_TRUE((*push)->Accept().ok());
  return *std::move(push);
}

TEST_F(AggregatorCoreTest, CloseRoundWaitsForTheFoldOfAnAcceptedPush) {
  PutBase();
  Open({"a", "b"});
  tensor::FlatModel d1 = Filled([](size_t i) { return 1.0f + i; });
  tensor::FlatModel d2 = Filled([](size_t i) { return -2.0f * i; });
  ASSERT_TRUE(PushModel(Meta("b", 1), d1).ok());
  // Accepted (the service acknowledges here) but its fold has not run yet.
  std::unique_ptr<AggregatorCore::Push> accepted = AcceptedPush(*core_, Meta("a", 3), d2);
  ASSERT_NE(accepted, nullptr);
  bool duplicate = false;
  ASSERT_TRUE(PushModel(Meta("a", 3), d2, &duplicate).ok());
  EXPECT_TRUE(duplicate);  // an accepted peer is not counted twice

  absl::Notification closed;
  absl::StatusOr<RoundResult> result;
  shoal::testing::JoiningThread closer([&] {
    result = core_->CloseRound("t", 1);
    closed.Notify();
  });
  // CloseRound must not publish before the accepted update is in the sum.
  EXPECT_FALSE(closed.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  accepted->Fold();
  closer.Join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->contributors, ElementsAre("a", "b"));
  EXPECT_EQ(result->num_samples, 4u);
  auto model = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(model.ok());
  for (size_t i = 0; i < model->model->values.size(); ++i) {
    const float mean = (1.0f * d1.values[i] + 3.0f * d2.values[i]) / 4.0f;
    EXPECT_FLOAT_EQ(model->model->values[i], 1.0f * i + mean) << i;
  }
  accepted.reset();  // already folded: nothing is added twice
  EXPECT_EQ(core_->CloseRound("t", 1)->digest, result->digest);
}

TEST_F(AggregatorCoreTest, AcceptedPushDestroyedBeforeItsFoldIsStillCounted) {
  PutBase();
  Open({"a"});
  tensor::FlatModel d = Filled([](size_t i) { return 0.25f * i; });
  std::unique_ptr<AggregatorCore::Push> accepted = AcceptedPush(*core_, Meta("a", 2), d);
  ASSERT_NE(accepted, nullptr);
  accepted.reset();  // e.g. the executor task ended early: the destructor folds
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->contributors, ElementsAre("a"));
  auto model = core_->GetModel("t", std::nullopt);
  for (size_t i = 0; i < d.values.size(); ++i) {
    EXPECT_FLOAT_EQ(model->model->values[i], 1.0f * i + d.values[i]) << i;
  }
  EXPECT_EQ(metrics_->updates_accepted.Value(), 1);
  EXPECT_EQ(TotalRejected(), 0);
}

TEST_F(AggregatorCoreTest, ReleaseTaskForgetsIt) {
  PutBase();
  Open({"a"});
  core_->ReleaseTask("t");
  core_->ReleaseTask("t");  // idempotent
  EXPECT_EQ(core_->GetModel("t", std::nullopt).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PushModel(Meta("a", 1), Filled([](size_t) { return 1.0f; })).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shoal::aggregator
