// libs/gossip FlowControl: dpwa's scores and draw, with a seeded RNG; demotion and re-admission.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "libs/gossip/flow_control.h"

namespace shoal::gossip {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

std::map<std::string, int> Draw(FlowControl& fc, int n, absl::Time now) {
  std::map<std::string, int> counts;
  for (int i = 0; i < n; ++i) {
    std::optional<std::string> p = fc.Choose(now);
    if (p) ++counts[*p];
  }
  return counts;
}

TEST(FlowControl, HealthyPeersArePickedUniformly) {
  FlowControl fc(FlowControlOptions{}, 7);
  fc.SetPeers({"a", "b", "c", "d"});
  const int n = 20000;
  std::map<std::string, int> counts = Draw(fc, n, kT0);
  ASSERT_EQ(counts.size(), 4u);
  for (const auto& [id, c] : counts) {
    EXPECT_NEAR(c, n / 4, n / 4 * 0.1) << id;  // within 10% of uniform
  }
}

TEST(FlowControl, SameSeedSameChoices) {
  FlowControl a(FlowControlOptions{}, 99), b(FlowControlOptions{}, 99);
  a.SetPeers({"x", "y", "z"});
  b.SetPeers({"x", "y", "z"});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Choose(kT0), b.Choose(kT0));
}

TEST(FlowControl, ScoresMoveByDpwasConstantsWithinBounds) {
  FlowControlOptions o;
  FlowControl fc(o, 1);
  fc.SetPeers({"a"});
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 1000);
  fc.Record("a", FetchOutcome::kSuccess, kT0);
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 1000);  // capped at max
  fc.Record("a", FetchOutcome::kTimeout, kT0);
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 900);
  fc.Record("a", FetchOutcome::kRefused, kT0);
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 800);
  for (int i = 0; i < 20; ++i) fc.Record("a", FetchOutcome::kInvalid, kT0);
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 10);  // floored at min
  fc.Record("a", FetchOutcome::kNoState, kT0);
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 10);  // "no state yet" is not a failure
  EXPECT_FALSE(fc.Score("zz").has_value());
}

TEST(FlowControl, PenalizedPeerIsPickedRarelyWithoutDemotion) {
  // dpwa's pure draw: no demotion backoff, so only the scores matter.
  FlowControlOptions o;
  o.demote_initial = absl::ZeroDuration();
  o.demote_max = absl::ZeroDuration();
  FlowControl fc(o, 3);
  fc.SetPeers({"a", "b", "c", "slow"});
  // slow: one timeout (900) is picked noticeably less often than the healthy peers...
  fc.Record("slow", FetchOutcome::kTimeout, kT0);
  // ...(its probe after the zero backoff is the next choice).
  EXPECT_EQ(fc.Choose(kT0), "slow");
  fc.Record("slow", FetchOutcome::kTimeout, kT0);  // 800, on probation again
  EXPECT_EQ(fc.Choose(kT0), "slow");
  // Mark it healthy-but-low without probation: a success re-admits at `readmit_score`; use a
  // low readmit score to observe the dpwa draw.
  FlowControlOptions low = o;
  low.readmit_score = 10;
  FlowControl d(low, 5);
  d.SetPeers({"a", "b", "c", "slow"});
  d.Record("slow", FetchOutcome::kTimeout, kT0);
  d.Record("slow", FetchOutcome::kTimeout, kT0);
  d.Record("slow", FetchOutcome::kSuccess, kT0);  // 810, no longer on probation
  EXPECT_DOUBLE_EQ(*d.Score("slow"), 810);
  const int n = 20000;
  std::map<std::string, int> counts = Draw(d, n, kT0);
  EXPECT_GT(counts["slow"], 0);
  EXPECT_LT(counts["slow"], counts["a"] / 2);
  EXPECT_NEAR(counts["a"], counts["b"], n * 0.05);
}

TEST(FlowControl, FailingPeerIsDemotedThenProbedThenReadmitted) {
  FlowControlOptions o;  // demotion 1 s, doubling, capped at 10 s
  FlowControl fc(o, 11);
  fc.SetPeers({"a", "b"});
  fc.Record("b", FetchOutcome::kTimeout, kT0);
  EXPECT_TRUE(fc.Demoted("b", kT0));
  EXPECT_EQ(fc.Summarize(kT0).demoted, 1u);
  // While demoted it is never chosen.
  std::map<std::string, int> during = Draw(fc, 1000, kT0 + absl::Milliseconds(500));
  EXPECT_EQ(during.count("b"), 0u);
  EXPECT_EQ(during["a"], 1000);
  // After the backoff: one probe.
  const absl::Time t1 = kT0 + absl::Seconds(1);
  EXPECT_FALSE(fc.Demoted("b", t1));
  EXPECT_EQ(fc.Choose(t1), "b");
  // The probe times out again: demoted for 2 s now.
  fc.Record("b", FetchOutcome::kTimeout, t1);
  EXPECT_DOUBLE_EQ(*fc.Score("b"), 800);
  EXPECT_TRUE(fc.Demoted("b", t1 + absl::Milliseconds(1900)));
  const absl::Time t2 = t1 + absl::Seconds(2);
  EXPECT_EQ(fc.Choose(t2), "b");
  // It answers: re-admitted at the initial score and picked like the others again.
  fc.Record("b", FetchOutcome::kSuccess, t2);
  EXPECT_DOUBLE_EQ(*fc.Score("b"), 1000);
  std::map<std::string, int> after = Draw(fc, 10000, t2);
  EXPECT_NEAR(after["b"], 5000, 500);
}

TEST(FlowControl, DemotionBackoffIsCapped) {
  FlowControlOptions o;
  FlowControl fc(o, 1);
  fc.SetPeers({"a"});
  absl::Time t = kT0;
  for (int i = 0; i < 10; ++i) fc.Record("a", FetchOutcome::kRefused, t);
  EXPECT_TRUE(fc.Demoted("a", t + absl::Seconds(9)));
  EXPECT_FALSE(fc.Demoted("a", t + absl::Seconds(10)));
}

TEST(FlowControl, NoStateSkipsBriefly) {
  FlowControl fc(FlowControlOptions{}, 1);
  fc.SetPeers({"a"});
  fc.Record("a", FetchOutcome::kNoState, kT0);
  EXPECT_FALSE(fc.Choose(kT0 + absl::Milliseconds(100)).has_value());
  EXPECT_EQ(fc.Choose(kT0 + absl::Milliseconds(200)), "a");
}

TEST(FlowControl, MembershipChangesKeepKnownScores) {
  FlowControl fc(FlowControlOptions{}, 1);
  fc.SetPeers({"a", "b"});
  fc.Record("a", FetchOutcome::kTimeout, kT0);
  fc.SetPeers({"a", "c"});
  EXPECT_DOUBLE_EQ(*fc.Score("a"), 900);
  EXPECT_DOUBLE_EQ(*fc.Score("c"), 1000);
  EXPECT_FALSE(fc.Score("b").has_value());
  FlowControl::Summary s = fc.Summarize(kT0 + absl::Minutes(1));
  EXPECT_EQ(s.peers, 2u);
  EXPECT_DOUBLE_EQ(s.min, 900);
  EXPECT_DOUBLE_EQ(s.max, 1000);
  EXPECT_DOUBLE_EQ(s.mean, 950);
  fc.SetPeers({});
  EXPECT_FALSE(fc.Choose(kT0).has_value());
}

}  // namespace
}  // namespace shoal::gossip
