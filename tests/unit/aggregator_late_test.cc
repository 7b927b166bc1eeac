// AggregatorCore's late updates (stragglers of federated-sync, OpenRoundRequest.late_peers): a
// late peer's update goes into whatever round is open when it arrives, scaled by its staleness.

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/aggregator/aggregator_core.h"
#include "tests/unit/aggregator_core_fixture.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class AggregatorLateTest : public AggregatorCoreFixture {
 protected:
  // Opens `round` on `base` with sync peers a and b and the late peer s.
  void OpenWithLate(uint64_t round, uint64_t base, uint32_t max_staleness = 4) {
    OpenRoundParams p{"t", round, base, {"a", "b"}, 0};
    p.late_peers = {"s"};
    p.late_staleness.set_max_staleness(max_staleness);
    p.late_staleness.set_staleness(common::v1::STALENESS_WEIGHTING_POLYNOMIAL);
    p.late_staleness.set_staleness_a(1);  // (1 + s)^-1
    absl::Status s = core_->OpenRound(p);
    ASSERT_TRUE(s.ok()) << s;
  }

  tensor::FlatModel Constant(float v) {
    return Filled([v](size_t) { return v; });
  }

  // Round 1 on version 0 with a and b (deltas 1): version 1 = version 0 + 1.
  void FirstRound() {
    PutBase();
    OpenWithLate(1, 0);
    ASSERT_TRUE(PushModel(Meta("a", 2, 1, 0), Constant(1)).ok());
    ASSERT_TRUE(PushModel(Meta("b", 2, 1, 0), Constant(1)).ok());
    auto closed = core_->CloseRound("t", 1);
    ASSERT_TRUE(closed.ok()) << closed.status();
    ASSERT_EQ(closed->version, 1u);
  }
};

TEST_F(AggregatorLateTest, ALateUpdateGoesIntoTheOpenRoundScaledByItsStaleness) {
  FirstRound();
  OpenWithLate(2, 1);
  std::vector<v1::PushAccepted> accepted;
  const uint64_t watch = core_->Watch("t", [&accepted](const v1::TaskEvent& e) {
    if (e.has_push_accepted()) accepted.push_back(e.push_accepted());
  });
  // s trained round 1's model (version 0): one version behind, so its delta counts half.
  ASSERT_TRUE(PushModel(Meta("s", 2, 1, 0), Constant(3)).ok());
  // A repeat of it (its answer was lost) is a duplicate, in this round or a later one.
  bool duplicate = false;
  ASSERT_TRUE(PushModel(Meta("s", 2, 1, 0), Constant(3), &duplicate).ok());
  EXPECT_TRUE(duplicate);
  ASSERT_TRUE(PushModel(Meta("a", 2, 2, 1), Constant(1)).ok());
  ASSERT_TRUE(PushModel(Meta("b", 2, 2, 1), Constant(1)).ok());
  core_->Unwatch(watch);
  ASSERT_EQ(accepted.size(), 3u);
  EXPECT_EQ(accepted[0].peer_id(), "s");
  EXPECT_EQ(accepted[0].round(), 2u);  // the round it went into
  EXPECT_EQ(accepted[0].base_version(), 0u);

  auto closed = core_->CloseRound("t", 2);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors, ElementsAre("a", "b", "s"));
  EXPECT_EQ(closed->num_samples, 6u);
  auto model = core_->GetModel("t", std::nullopt);
  ASSERT_TRUE(model.ok());
  ASSERT_EQ(model->version, 2u);
  // Version 1 is i + 1; the round's mean delta (2 x 1 + 2 x 1 + 2 x 0.5 x 3) / 6 = 7/6.
  for (size_t i = 0; i < model->model->values.size(); ++i) {
    EXPECT_FLOAT_EQ(model->model->values[i], static_cast<float>(i) + 1 + 7.0f / 6) << i;
  }
  // Still a duplicate in the next round: it is in version 2.
  OpenWithLate(3, 2);
  duplicate = false;
  ASSERT_TRUE(PushModel(Meta("s", 2, 1, 0), Constant(3), &duplicate).ok());
  EXPECT_TRUE(duplicate);
}

// The round a late update streams into closes before the update is complete: it is refused
// UNAVAILABLE (retry), and the retry goes into the next round, not lost.
TEST_F(AggregatorLateTest, ALateUpdateCutOffByTheCloseIsRetriedIntoTheNextRound) {
  FirstRound();
  OpenWithLate(2, 1);
  auto streaming = Streamed(Meta("s", 2, 1, 0), Constant(3));
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  ASSERT_NE(*streaming, nullptr);
  ASSERT_TRUE(PushModel(Meta("a", 2, 2, 1), Constant(1)).ok());
  ASSERT_TRUE(PushModel(Meta("b", 2, 2, 1), Constant(1)).ok());
  auto closed = core_->CloseRound("t", 2);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors, ElementsAre("a", "b"));
  const absl::Status cut = (*streaming)->Commit();
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  EXPECT_THAT(cut.message(), HasSubstr("retry into the next round"));
  // The peer retries once round 3 is open: two versions behind now, a third of its delta.
  OpenWithLate(3, 2);
  ASSERT_TRUE(PushModel(Meta("s", 2, 1, 0), Constant(3)).ok());
  ASSERT_TRUE(PushModel(Meta("a", 2, 3, 2), Constant(0)).ok());
  ASSERT_TRUE(PushModel(Meta("b", 2, 3, 2), Constant(0)).ok());
  closed = core_->CloseRound("t", 3);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors, ElementsAre("a", "b", "s"));
  // A sync peer's update cut off the same way is FAILED_PRECONDITION: its round is gone.
  OpenWithLate(4, 3);
  auto sync = Streamed(Meta("a", 2, 4, 3), Constant(1));
  ASSERT_TRUE(sync.ok()) << sync.status();
  ASSERT_TRUE(core_->CloseRound("t", 4).ok());
  EXPECT_EQ((*sync)->Commit().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(AggregatorLateTest, LateUpdatesKeepToTheirRules) {
  FirstRound();
  // Between rounds a late update is told to retry (into the next round).
  absl::Status between = PushModel(Meta("s", 2, 1, 0), Constant(3));
  EXPECT_EQ(between.code(), absl::StatusCode::kUnavailable) << between;
  EXPECT_THAT(between.message(), HasSubstr("retry"));

  OpenWithLate(2, 1, /*max_staleness=*/0);
  // Over max_staleness: refused.
  absl::Status stale = PushModel(Meta("s", 2, 1, 0), Constant(3));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(stale.message(), HasSubstr("max_staleness 0"));
  EXPECT_EQ(Rejected(RejectReason::kStale), 1);
  // A base newer than the round's: refused.
  absl::Status future = PushModel(Meta("s", 2, 2, 7), Constant(3));
  EXPECT_EQ(future.code(), absl::StatusCode::kFailedPrecondition) << future;
  // Fresh (trained from this round's base): taken whole; a second one in the same round waits.
  ASSERT_TRUE(PushModel(Meta("s", 2, 2, 1), Constant(3)).ok());
  absl::Status second = PushModel(Meta("s", 2, 1, 1), Constant(3));
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable) << second;
  EXPECT_THAT(second.message(), HasSubstr("already contributed"));
  // A sync peer's update for another round is refused as before.
  absl::Status old = PushModel(Meta("a", 2, 1, 0), Constant(1));
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;

  // A peer cannot be both expected and late.
  OpenRoundParams both{"t", 3, 1, {"a", "s"}, 0};
  both.late_peers = {"s"};
  EXPECT_EQ(core_->OpenRound(both).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::aggregator
