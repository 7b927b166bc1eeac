#include "services/coordinator/modes/federated_sync/straggler_tracker.h"

#include <map>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Times = std::map<std::string, std::optional<absl::Duration>>;
using LateTimes = std::map<std::string, absl::Duration>;

absl::Duration S(double seconds) { return absl::Seconds(seconds); }

TEST(StragglerTrackerTest, ASlowPeerMovesAfterTheRoundsInARowAndBackOnceItKeepsPace) {
  StragglerTracker t(/*factor=*/2, /*rounds=*/2);
  ASSERT_TRUE(t.enabled());
  // c takes 5x the median (10 s): one slow round is not enough.
  EXPECT_THAT(t.OnRoundClosed({{"a", S(10)}, {"b", S(11)}, {"c", S(50)}}, {}), IsEmpty());
  EXPECT_FALSE(t.IsAsync("c"));
  auto moves = t.OnRoundClosed({{"a", S(10)}, {"b", S(9)}, {"c", S(48)}}, {});
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].peer, "c");
  EXPECT_TRUE(moves[0].to_async);
  EXPECT_THAT(moves[0].why, HasSubstr("2x the median of 10.00s"));
  EXPECT_THAT(t.async_peers(), ElementsAre("c"));
  // Async: slow late updates keep it there; two fast ones in a row bring it back.
  EXPECT_THAT(t.OnRoundClosed({{"a", S(10)}, {"b", S(10)}}, {{"c", S(45)}}), IsEmpty());
  EXPECT_THAT(t.OnRoundClosed({{"a", S(10)}, {"b", S(10)}}, {{"c", S(15)}}), IsEmpty());
  EXPECT_THAT(t.OnRoundClosed({{"a", S(10)}, {"b", S(10)}}, {{"c", S(60)}}), IsEmpty());
  EXPECT_THAT(t.OnRoundClosed({{"a", S(10)}, {"b", S(10)}}, {{"c", S(19)}}), IsEmpty());
  moves = t.OnRoundClosed({{"a", S(10)}, {"b", S(10)}}, {{"c", S(20)}});
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_FALSE(moves[0].to_async);
  EXPECT_THAT(moves[0].why, HasSubstr("within 2x the median"));
  EXPECT_THAT(t.async_peers(), IsEmpty());
}

TEST(StragglerTrackerTest, AMissedRoundCountsAsSlowAndAFastRoundResetsTheCount) {
  StragglerTracker t(3, 2);
  EXPECT_THAT(t.OnRoundClosed({{"a", S(1)}, {"b", S(1)}, {"c", std::nullopt}}, {}), IsEmpty());
  EXPECT_THAT(t.OnRoundClosed({{"a", S(1)}, {"b", S(1)}, {"c", S(2)}}, {}), IsEmpty());
  EXPECT_THAT(t.OnRoundClosed({{"a", S(1)}, {"b", S(1)}, {"c", std::nullopt}}, {}), IsEmpty());
  auto moves = t.OnRoundClosed({{"a", S(1)}, {"b", S(1)}, {"c", std::nullopt}}, {});
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_THAT(moves[0].why, HasSubstr("missed the round"));
}

TEST(StragglerTrackerTest, NoJudgementWithoutTwoTimesAndTheLastSyncPeerStays) {
  StragglerTracker t(2, 1);
  // One time to compare with: nobody moves.
  EXPECT_THAT(t.OnRoundClosed({{"a", S(1)}, {"b", std::nullopt}}, {}), IsEmpty());
  // Two peers: the median is their mean, and neither is over twice it.
  EXPECT_THAT(t.OnRoundClosed({{"a", S(1)}, {"b", S(100)}}, {}), IsEmpty());
  // Of two sync peers both missing... judged only with two times: here a and b arrive, c and d
  // miss; both move, and two stay.
  auto moves =
      t.OnRoundClosed({{"a", S(1)}, {"b", S(1)}, {"c", std::nullopt}, {"d", std::nullopt}}, {});
  EXPECT_EQ(moves.size(), 2u);
  EXPECT_THAT(t.async_peers(), ElementsAre("c", "d"));
  t.Remove("c");
  EXPECT_THAT(t.async_peers(), ElementsAre("d"));
  // Off: nothing ever moves.
  StragglerTracker off(0, 2);
  EXPECT_FALSE(off.enabled());
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(off.OnRoundClosed({{"a", S(1)}, {"b", S(1)}, {"c", S(100)}}, {}), IsEmpty());
  }
}

}  // namespace
}  // namespace shoal::coordinator
