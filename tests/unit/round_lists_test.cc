// What the coordinator sends of a round history: the newest rounds' per-peer lists within a
// budget, counts for all.

#include "services/coordinator/round_lists.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;

// Round r with `peers` participants (each timed) and one late and one dropped peer.
v1::RoundSummary Round(uint64_t r, int peers) {
  v1::RoundSummary round;
  round.set_round(r);
  round.set_mean_train_loss(0.25);
  round.add_removed("removed");
  for (int i = 0; i < peers; ++i) {
    round.add_participants(absl::StrCat("p", i));
    round.add_peer_times()->set_peer_id(absl::StrCat("p", i));
  }
  round.add_late("p0");
  round.add_dropped("gone");
  return round;
}

google::protobuf::RepeatedPtrField<v1::RoundSummary> History() {
  google::protobuf::RepeatedPtrField<v1::RoundSummary> h;
  *h.Add() = Round(1, 4);  // 10 entries
  *h.Add() = Round(2, 3);  // 8
  *h.Add() = Round(3, 2);  // 6
  return h;
}

TEST(RoundListsTest, CountsEveryListEntry) {
  EXPECT_EQ(ListEntries(Round(1, 4)), 10u);
  EXPECT_EQ(ListEntries(v1::RoundSummary()), 0u);
}

TEST(RoundListsTest, NewestRoundsKeepTheirListsWithinTheBudget) {
  for (const auto& [budget, full] : std::vector<std::pair<size_t, int>>{
           {0, 0}, {5, 0}, {6, 1}, {13, 1}, {14, 2}, {23, 2}, {24, 3}, {1000, 3}}) {
    SCOPED_TRACE(budget);
    google::protobuf::RepeatedPtrField<v1::RoundSummary> out;
    AppendRounds(History(), budget, &out);
    ASSERT_EQ(out.size(), 3);
    for (int i = 0; i < 3; ++i) {
      const v1::RoundSummary& r = out[i];
      const bool listed = i >= 3 - full;
      EXPECT_EQ(r.lists_omitted(), !listed) << i;
      EXPECT_EQ(r.participants_size(), listed ? 4 - i : 0);
      EXPECT_EQ(r.peer_times_size(), listed ? 4 - i : 0);
      EXPECT_EQ(r.late_size(), listed ? 1 : 0);
      EXPECT_EQ(r.dropped_size(), listed ? 1 : 0);
      // Counts and every other field, either way.
      EXPECT_EQ(r.participant_count(), static_cast<uint32_t>(4 - i));
      EXPECT_EQ(r.late_count(), 1u);
      EXPECT_EQ(r.dropped_count(), 1u);
      EXPECT_EQ(r.round(), static_cast<uint64_t>(i + 1));
      EXPECT_DOUBLE_EQ(r.mean_train_loss(), 0.25);
      EXPECT_THAT(r.removed(), ElementsAre("removed"));
    }
  }
}

TEST(RoundListsTest, AppendsBehindWhatIsThere) {
  google::protobuf::RepeatedPtrField<v1::RoundSummary> out;
  out.Add()->set_round(99);
  AppendRounds(History(), kRoundListBudget, &out);
  ASSERT_EQ(out.size(), 4);
  EXPECT_EQ(out[0].round(), 99u);
  EXPECT_EQ(out[3].round(), 3u);
  EXPECT_FALSE(out[3].lists_omitted());
}

}  // namespace
}  // namespace shoal::coordinator
