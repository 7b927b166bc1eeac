// rpc::Pacer on a FakeClock: each message's wait, sharing the link between streams, no credit
// for idle time, the message size; and --serve-pacing's parsing and rate.

#include <atomic>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/pacer.h"
#include "tests/testing/fake_clock.h"

namespace shoal::rpc {
namespace {

using shoal::testing::FakeClock;
using ::testing::HasSubstr;

TEST(PacerTest, EachMessageWaitsForTheBytesReservedBeforeIt) {
  FakeClock clock;
  Pacer pacer([] { return 1000.0; }, clock);  // 1,000 bytes/s
  // The first goes at once; the next ones after the bytes before them, whoever sends them
  // (two streams sharing the uplink interleave).
  EXPECT_EQ(pacer.Reserve(500), absl::ZeroDuration());
  EXPECT_EQ(pacer.Reserve(250), absl::Milliseconds(500));
  EXPECT_EQ(pacer.Reserve(1000), absl::Milliseconds(750));
  clock.Advance(absl::Milliseconds(1000));
  EXPECT_EQ(pacer.Reserve(100), absl::Milliseconds(750));
  // Idle time is not saved up: after a pause only the next message goes at once.
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(pacer.Reserve(2000), absl::ZeroDuration());
  EXPECT_EQ(pacer.Reserve(10), absl::Seconds(2));
}

TEST(PacerTest, ARateOfZeroDoesNotPaceAndTheRateIsAskedEachTime) {
  FakeClock clock;
  std::atomic<double> rate{0};
  Pacer pacer([&rate] { return rate.load(); }, clock);
  EXPECT_EQ(pacer.rate(), 0);
  EXPECT_EQ(pacer.Reserve(1 << 30), absl::ZeroDuration());
  EXPECT_EQ(pacer.Reserve(1 << 30), absl::ZeroDuration());
  EXPECT_EQ(pacer.MessageBytes(1 << 20), 1u << 20);
  rate = 2e6;  // measured: paced from now on
  EXPECT_EQ(pacer.Reserve(1'000'000), absl::ZeroDuration());
  EXPECT_EQ(pacer.Reserve(1'000'000), absl::Milliseconds(500));
  rate = -1;  // nonsense is not a rate
  EXPECT_EQ(pacer.rate(), 0);
  EXPECT_EQ(pacer.Reserve(1'000'000), absl::ZeroDuration());
}

TEST(PacerTest, PacedMessagesAreFiveMillisecondsOfTheRateWithinBounds) {
  FakeClock clock;
  std::atomic<double> rate{5e6 / 8};  // 5 Mbit/s: 3 KB in 5 ms, so the smallest
  Pacer pacer([&rate] { return rate.load(); }, clock);
  EXPECT_EQ(pacer.MessageBytes(1 << 20), 16u << 10);
  rate = 10e6;  // 80 Mbit/s: 50 KB
  EXPECT_EQ(pacer.MessageBytes(1 << 20), 50'000u);
  rate = 1e9;
  EXPECT_EQ(pacer.MessageBytes(1 << 20), 256u << 10);
}

TEST(PacingSettingTest, ParsesAutoOffAndARate) {
  absl::StatusOr<PacingSetting> automatic = PacingSetting::Parse("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->RateFor(0), 0);                 // not measured
  EXPECT_EQ(automatic->RateFor(2.5e6), 2.5e6);         // 20 Mbit/s: a user's uplink
  EXPECT_EQ(automatic->RateFor(kSlowUplinkBelow), 0);  // 200 Mbit/s and more: not paced
  EXPECT_EQ(automatic->RateFor(1.2e9), 0);

  absl::StatusOr<PacingSetting> off = PacingSetting::Parse("off");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->RateFor(2.5e6), 0);

  absl::StatusOr<PacingSetting> fixed = PacingSetting::Parse("20");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->RateFor(0), 2.5e6);
  EXPECT_EQ(fixed->RateFor(1e9), 2.5e6);
  EXPECT_EQ(PacingSetting::Parse("0.5")->RateFor(0), 62'500);

  for (const char* bad : {"", "0", "-3", "fast", "20Mbit", "nan", "2e6"}) {
    absl::StatusOr<PacingSetting> s = PacingSetting::Parse(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("--serve-pacing"));
    EXPECT_THAT(s.status().message(), HasSubstr(std::string("'") + bad + "'"));
  }
}

}  // namespace
}  // namespace shoal::rpc
