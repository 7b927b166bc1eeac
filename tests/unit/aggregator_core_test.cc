#include "services/aggregator/aggregator_core.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/memory_budget.h"
#include "tests/testing/joining_thread.h"
#include "tests/unit/aggregator_core_fixture.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class AggregatorCoreTest : public AggregatorCoreFixture {};

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
  // Every download of a version shares one record of its tensors' digests (hashed once).
  ASSERT_NE(got->tensor_digests, nullptr);
  EXPECT_EQ(core_->GetModel("t", 0)->tensor_digests, got->tensor_digests);
  tensor::TensorDigests fresh;
  EXPECT_EQ(got->Raw()->digests, fresh.Of(m));
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
  EXPECT_NE(core_->GetModel("t", 5)->tensor_digests, got->tensor_digests);
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
  m2.train_ms = 750;
  std::vector<v1::PushAccepted> accepted;
  const uint64_t watch = core_->Watch("t", [&accepted](const v1::TaskEvent& e) {
    if (e.has_push_accepted()) accepted.push_back(e.push_accepted());
  });
  ASSERT_TRUE(PushModel(m1, d1).ok());
  ASSERT_TRUE(PushModel(m2, d2).ok());
  core_->Unwatch(watch);
  // Each acceptance says how long the peer trained and how many bytes its update took.
  ASSERT_EQ(accepted.size(), 2u);
  EXPECT_EQ(accepted[1].peer_id(), "a");
  EXPECT_EQ(accepted[1].train_ms(), 750);
  EXPECT_EQ(accepted[1].update_bytes(), d2.layout.total_bytes());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->version, 1u);
  EXPECT_EQ(result->model_bytes, d1.layout.total_bytes());
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
  EXPECT_EQ(metrics_->tasks_held.Value(), 1);
  // It says the newest version it held, so that a restore numbers the next one after it.
  EXPECT_EQ(core_->ReleaseTask("t"), std::optional<uint64_t>(0));
  EXPECT_EQ(metrics_->tasks_held.Value(), 0);
  EXPECT_EQ(core_->ReleaseTask("t"), std::nullopt);  // idempotent
  EXPECT_EQ(core_->GetModel("t", std::nullopt).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PushModel(Meta("a", 1), Filled([](size_t) { return 1.0f; })).code(),
            absl::StatusCode::kNotFound);
}

// A registration names what the aggregator holds; its answer frees what the coordinator no
// longer uses, but never a task the coordinator set up here again after the registration.
TEST_F(AggregatorCoreTest, AReleaseNamedByARegistrationSparesATaskCalledAboutSince) {
  PutBase();
  ASSERT_TRUE(core_->PutModel("u", 0, Filled([](size_t) { return 1.0f; })).ok());
  core_->SetMembers("v", {{"a", "token"}});
  const TaskCalls::Held held = core_->Held();
  EXPECT_THAT(held.names, ElementsAre("t", "u", "v"));
  Open({"a"});  // the coordinator's call about t after the registration
  EXPECT_FALSE(core_->ReleaseUnlessCalledSince("t", held.as_of));
  EXPECT_TRUE(core_->ReleaseUnlessCalledSince("u", held.as_of));
  EXPECT_TRUE(core_->ReleaseUnlessCalledSince("v", held.as_of));
  EXPECT_FALSE(core_->ReleaseUnlessCalledSince("w", held.as_of)) << "never held";
  EXPECT_TRUE(core_->GetModel("t", std::nullopt).ok());
  EXPECT_EQ(core_->GetModel("u", std::nullopt).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(metrics_->tasks_held.Value(), 1);
  EXPECT_THAT(core_->Held().names, ElementsAre("t"));
  // Told again at the next registration, t goes too.
  EXPECT_TRUE(core_->ReleaseUnlessCalledSince("t", core_->Held().as_of));
  EXPECT_THAT(core_->Held().names, ::testing::IsEmpty());
  EXPECT_EQ(metrics_->tasks_held.Value(), 0);
}

// ---------------------------------------------------------------------------------------------
// Strategies

OpenRoundParams RoundWith(v1::AggregationSettings aggregation, std::vector<std::string> peers,
                          uint64_t round = 1, uint64_t base = 0) {
  OpenRoundParams p{"t", round, base, std::move(peers), 0};
  p.aggregation = std::move(aggregation);
  return p;
}

TEST_F(AggregatorCoreTest, MedianRoundGivesTheCoordinateWiseMedianUnweighted) {
  PutBase();  // base[i] = i
  ASSERT_TRUE(
      core_->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_MEDIAN), {"a", "b", "c"}))
          .ok());
  // Per coordinate the median of {1, 2i, -3}: 0 at i = 0 (the values 1, 0, -3), else 1.
  ASSERT_TRUE(PushModel(Meta("a", 1), Filled([](size_t) { return 1.0f; })).ok());
  ASSERT_TRUE(PushModel(Meta("b", 100), Filled([](size_t i) { return 2.0f * i; })).ok());
  ASSERT_TRUE(PushModel(Meta("c", 1), Filled([](size_t) { return -3.0f; })).ok());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->version, 1u);
  EXPECT_THAT(result->contributors, ElementsAre("a", "b", "c"));
  EXPECT_EQ(result->num_samples, 102u);
  EXPECT_EQ(result->note, "");
  auto model = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->model->values[0], 0.0f);
  for (size_t i = 1; i < model->model->values.size(); ++i) {
    EXPECT_EQ(model->model->values[i], static_cast<float>(i) + 1.0f) << i;  // not b's 2i
  }
  EXPECT_EQ(result->digest, model->model->Digest());
}

TEST_F(AggregatorCoreTest, ByzantineUpdateDragsTheMeanButNotTheMedian) {
  PutBase();
  auto push_all = [&](uint64_t round, uint64_t base) {
    const float honest[] = {1.0f, 1.5f, 0.5f};
    const char* names[] = {"h0", "h1", "h2"};
    for (int h = 0; h < 3; ++h) {
      ASSERT_TRUE(
          PushModel(Meta(names[h], 1, round, base), Filled([&](size_t) { return honest[h]; }))
              .ok());
    }
    ASSERT_TRUE(
        PushModel(Meta("byz", 1, round, base), Filled([](size_t) { return -1000.0f; })).ok());
  };
  const std::vector<std::string> peers = {"h0", "h1", "h2", "byz"};
  ASSERT_TRUE(core_->OpenRound(RoundWith(v1::AggregationSettings(), peers)).ok());  // mean
  push_all(1, 0);
  ASSERT_TRUE(core_->CloseRound("t", 1).ok());
  auto mean = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(mean.ok());
  for (size_t i = 0; i < mean->model->values.size(); ++i) {
    EXPECT_FLOAT_EQ(mean->model->values[i], i + (3.0f - 1000.0f) / 4) << i;
  }
  ASSERT_TRUE(
      core_->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_MEDIAN), peers, 2, 1))
          .ok());
  push_all(2, 1);
  ASSERT_TRUE(core_->CloseRound("t", 2).ok());
  auto median = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(median.ok());
  for (size_t i = 0; i < median->model->values.size(); ++i) {
    // Median of {-1000, 0.5, 1, 1.5}: (0.5 + 1) / 2.
    EXPECT_FLOAT_EQ(median->model->values[i], mean->model->values[i] + 0.75f) << i;
  }
}

TEST_F(AggregatorCoreTest, DegradedKrumRoundSaysSoInItsNote) {
  PutBase();
  common::v1::AggregationOptions options;
  options.set_byzantine_peers(1);  // needs 2f+3 = 5 updates
  ASSERT_TRUE(core_
                  ->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_KRUM, options),
                                        {"a", "b", "c", "z"}))
                  .ok());
  ASSERT_TRUE(PushModel(Meta("a", 1), Filled([](size_t) { return 1.0f; })).ok());
  ASSERT_TRUE(PushModel(Meta("b", 1), Filled([](size_t) { return 1.1f; })).ok());
  ASSERT_TRUE(PushModel(Meta("c", 1), Filled([](size_t) { return 0.9f; })).ok());
  ASSERT_TRUE(PushModel(Meta("z", 1), Filled([](size_t) { return 50.0f; })).ok());
  auto result = core_->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->note,
            "krum: 4 updates fit byzantine_peers 0, not the configured 1 (it needs 2f+3 updates)");
  EXPECT_THAT(result->contributors, ElementsAre("a", "b", "c", "z"));
  // Krum picks the update closest to its neighbours: a's.
  auto model = core_->GetModel("t", std::nullopt);
  for (size_t i = 0; i < model->model->values.size(); ++i) {
    EXPECT_FLOAT_EQ(model->model->values[i], i + 1.0f) << i;
  }
  EXPECT_EQ(core_->CloseRound("t", 1)->note, result->note);  // idempotent, note included
}

TEST_F(AggregatorCoreTest, RoundStrategyRules) {
  PutBase();
  common::v1::AggregationOptions trim;
  trim.set_trim_ratio(0.2);
  absl::Status s =
      core_->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_MEDIAN, trim), {"a"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("aggregation_options.trim_ratio"));
  ASSERT_TRUE(
      core_->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_MEDIAN), {"a"})).ok());
  s = core_->OpenRound(RoundWith(v1::AggregationSettings(), {"a"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "round 1 of task 't' is open with aggregation median, not mean");
  // Unspecified is mean, so an explicit mean round re-opens an unspecified one.
  ASSERT_TRUE(core_->OpenRound(RoundWith(v1::AggregationSettings(), {"a"}, 2)).ok());
  EXPECT_TRUE(
      core_->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_MEAN), {"a", "b"}, 2))
          .ok());
}

TEST_F(AggregatorCoreTest, RoundThatWouldHoldTooMuchIsRefusedNamingBothNumbers) {
  Make(4, /*max_buffer_bytes=*/128);
  PutBase();  // 13 floats: 52 B
  absl::Status s = core_->OpenRound(
      RoundWith(StrategySettings(common::v1::AGGREGATION_MEDIAN), {"a", "b", "c"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "round 1 of task 't': median holds up to 3 updates × 52 B = 156 B, over this "
            "aggregator's --max-buffer-bytes 128 B");
  EXPECT_EQ(metrics_->max_buffer_refusals.Value(), 1);
  // Two fit; mean holds one running sum whatever K.
  EXPECT_TRUE(
      core_->OpenRound(RoundWith(StrategySettings(common::v1::AGGREGATION_MEDIAN), {"a", "b"}))
          .ok());
  EXPECT_TRUE(
      core_->OpenRound(RoundWith(v1::AggregationSettings(), {"a", "b", "c", "d", "e"}, 2)).ok());
  EXPECT_EQ(metrics_->max_buffer_refusals.Value(), 1);
}

TEST(MemoryBudgetTest, MessagesUseReadableSizes) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.0 KiB");
  EXPECT_EQ(HumanBytes((1 << 20) - 1), "1.0 MiB");
  EXPECT_EQ(HumanBytes(uint64_t{4} << 30), "4.0 GiB");
  auto median = aggregation::MakeStrategy({common::v1::AGGREGATION_MEDIAN, {}, 1});
  ASSERT_TRUE(median.ok());
  absl::Status s = CheckRoundMemory(*median, 5, 1677722, uint64_t{4} << 20, "round 3 of task 't'");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "round 3 of task 't': median holds up to 5 updates × 1.6 MiB = 8.0 MiB, over this "
            "aggregator's --max-buffer-bytes 4.0 MiB");
  EXPECT_TRUE(CheckRoundMemory(*median, 2, 1677722, uint64_t{4} << 20, "r").ok());
  auto mean = aggregation::MakeStrategy({common::v1::AGGREGATION_MEAN, {}, 1});
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ(CheckRoundMemory(*mean, 100, 3u << 20, 2u << 20, "r").message(),
            "r: mean holds a running sum of 3.0 MiB, over this aggregator's --max-buffer-bytes "
            "2.0 MiB");
  s = CheckBufferMemory(*mean, 5, 1677722, uint64_t{4} << 20, "the buffer of task 't'");
  EXPECT_EQ(s.message(),
            "the buffer of task 't' (mean) holds up to 5 updates × 1.6 MiB = 8.0 MiB, over this "
            "aggregator's --max-buffer-bytes 4.0 MiB");
}

}  // namespace
}  // namespace shoal::aggregator
