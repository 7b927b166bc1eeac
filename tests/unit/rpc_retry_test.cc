// rpc::Retry driven by a FakeClock (the sleeps between attempts advance it), and rpc::Wakeup.

#include <atomic>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/wait.h"

namespace shoal::rpc {
namespace {

using shoal::testing::FakeClock;
using ::testing::ElementsAre;

// Attempts that fail with the scripted errors, then succeed; each records when it ran and the
// deadline it was given.
struct ScriptedCalls {
  explicit ScriptedCalls(FakeClock& clock, std::vector<absl::Status> errors)
      : clock(clock), errors(std::move(errors)) {}

  absl::StatusOr<int> operator()(absl::Time deadline) {
    started.push_back(clock.Now());
    deadlines.push_back(deadline);
    const size_t n = started.size();
    if (n <= errors.size()) return errors[n - 1];
    return static_cast<int>(n);
  }

  FakeClock& clock;
  std::vector<absl::Status> errors;
  std::vector<absl::Time> started;
  std::vector<absl::Time> deadlines;
};

// A sleep that lets the fake time pass and records the delays.
struct FakeSleep {
  FakeClock& clock;
  std::vector<absl::Duration>* delays;
  bool operator()(absl::Duration d) const {
    delays->push_back(d);
    clock.Advance(d);
    return true;
  }
};

RetryOptions Options() {
  RetryOptions o;
  o.backoff = BackoffOptions{absl::Milliseconds(100), absl::Milliseconds(400), 2.0, 0.2};
  o.attempt_timeout = absl::Seconds(5);
  return o;
}

TEST(Retry, RetriesTransientErrorsWithCappedExponentialJitteredDelays) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  ScriptedCalls calls(clock, {absl::UnavailableError("down"), absl::ResourceExhaustedError("busy"),
                              absl::UnavailableError("down"), absl::UnavailableError("down"),
                              absl::UnavailableError("down")});
  std::vector<absl::Duration> delays;
  absl::StatusOr<int> result =
      Retry(clock, Options(), start + absl::Minutes(1), FakeSleep{clock, &delays}, std::ref(calls));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 6);
  ASSERT_EQ(delays.size(), 5u);
  // 100, 200, 400, 400, 400 ms, each within ±20 %.
  const double nominal_ms[] = {100, 200, 400, 400, 400};
  for (size_t i = 0; i < delays.size(); ++i) {
    EXPECT_GE(delays[i], absl::Milliseconds(nominal_ms[i] * 0.8)) << i;
    EXPECT_LE(delays[i], absl::Milliseconds(nominal_ms[i] * 1.2)) << i;
  }
  // Every attempt gets its own bound, measured on the injected clock.
  for (size_t i = 0; i < calls.started.size(); ++i) {
    EXPECT_EQ(calls.deadlines[i], calls.started[i] + absl::Seconds(5)) << i;
  }
}

TEST(Retry, OtherErrorsAndSuccessEndAtOnce) {
  FakeClock clock;
  std::vector<absl::Duration> delays;
  ScriptedCalls rejected(clock, {absl::InvalidArgumentError("bad")});
  absl::StatusOr<int> r = Retry(clock, Options(), clock.Now() + absl::Minutes(1),
                                FakeSleep{clock, &delays}, std::ref(rejected));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_EQ(rejected.started.size(), 1u);

  ScriptedCalls fine(clock, {});
  r = Retry(clock, Options(), clock.Now() + absl::Minutes(1), FakeSleep{clock, &delays},
            std::ref(fine));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(fine.started.size(), 1u);
  EXPECT_TRUE(delays.empty());
}

TEST(Retry, NoAttemptStartsAtOrAfterTheDeadlineAndNoneOutlivesIt) {
  FakeClock clock;
  const absl::Time deadline = clock.Now() + absl::Seconds(2);
  std::vector<absl::Status> errors(100, absl::UnavailableError("down"));
  ScriptedCalls calls(clock, errors);
  std::vector<absl::Duration> delays;
  absl::StatusOr<int> r =
      Retry(clock, Options(), deadline, FakeSleep{clock, &delays}, std::ref(calls));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_GT(calls.started.size(), 3u);
  EXPECT_LT(calls.started.size(), 100u);
  for (size_t i = 0; i < calls.started.size(); ++i) {
    EXPECT_LT(calls.started[i], deadline) << i;
    EXPECT_LE(calls.deadlines[i], deadline) << i;
  }
  // The loop gave up instead of sleeping past the deadline.
  EXPECT_LT(clock.Now(), deadline);
}

// An attempt that ran out of its own bound (a stalled stream, a callee held up) is tried again
// while the deadline has room; DEADLINE_EXCEEDED at the deadline itself, or from an attempt
// whose bound is the deadline, ends the loop.
TEST(Retry, AnAttemptCutByItsOwnBoundIsRetriedWhileTheDeadlineAllows) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::vector<absl::Duration> delays;
  // Each attempt uses up its 5 s bound, as a call that hangs until its gRPC deadline would.
  std::vector<absl::Time> started;
  int attempts = 0;
  auto hang_twice = [&](absl::Time attempt_deadline) -> absl::StatusOr<int> {
    started.push_back(clock.Now());
    if (++attempts > 2) return attempts;
    clock.Advance(attempt_deadline - clock.Now());
    return absl::DeadlineExceededError("Deadline Exceeded");
  };
  absl::StatusOr<int> r =
      Retry(clock, Options(), start + absl::Minutes(1), FakeSleep{clock, &delays}, hang_twice);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 3);
  ASSERT_EQ(started.size(), 3u);
  EXPECT_GE(started[1], start + absl::Seconds(5));

  // Hanging every time: retried until the next attempt would start past the deadline, the last
  // one cut to the deadline.
  attempts = -100;
  started.clear();
  const absl::Time deadline = clock.Now() + absl::Seconds(12);
  r = Retry(clock, Options(), deadline, FakeSleep{clock, &delays}, hang_twice);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_EQ(started.size(), 3u);  // at 0, ~5.1 and ~10.3 s; the third is cut at 12 s
  EXPECT_EQ(clock.Now(), deadline);

  // An attempt bounded by the deadline alone is not retried when it runs out.
  RetryOptions unbounded = Options();
  unbounded.attempt_timeout = absl::InfiniteDuration();
  attempts = -100;
  started.clear();
  r = Retry(clock, unbounded, clock.Now() + absl::Seconds(30), FakeSleep{clock, &delays},
            hang_twice);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_EQ(started.size(), 1u);

  // A caller's own `retryable` decides alone.
  RetryOptions strict = Options();
  strict.retryable = [](const absl::Status& s) { return absl::IsUnavailable(s); };
  attempts = 0;
  started.clear();
  r = Retry(clock, strict, clock.Now() + absl::Minutes(1), FakeSleep{clock, &delays}, hang_twice);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_EQ(started.size(), 1u);
}

TEST(Retry, StopsWhenTheSleepSaysStopAndHonoursMaxAttempts) {
  FakeClock clock;
  std::vector<absl::Status> errors(10, absl::UnavailableError("down"));
  ScriptedCalls stopped(clock, errors);
  int sleeps = 0;
  absl::StatusOr<int> r = Retry(
      clock, Options(), absl::InfiniteFuture(), [&](absl::Duration) { return ++sleeps < 2; },
      std::ref(stopped));
  EXPECT_TRUE(absl::IsUnavailable(r.status()));
  EXPECT_EQ(stopped.started.size(), 2u);  // attempt, sleep, attempt, sleep refused

  RetryOptions o = Options();
  o.max_attempts = 3;
  o.retryable = [](const absl::Status&) { return true; };  // everything, e.g. probes
  ScriptedCalls limited(clock, std::vector<absl::Status>(10, absl::NotFoundError("x")));
  std::vector<absl::Duration> delays;
  r = Retry(clock, o, absl::InfiniteFuture(), FakeSleep{clock, &delays}, std::ref(limited));
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_EQ(limited.started.size(), 3u);
  EXPECT_EQ(delays.size(), 2u);  // no sleep after the last attempt
}

TEST(Retry, AcceptsAttemptsReturningAPlainStatus) {
  FakeClock clock;
  int calls = 0;
  std::vector<absl::Duration> delays;
  absl::Status s = Retry(
      clock, Options(), clock.Now() + absl::Minutes(1), FakeSleep{clock, &delays},
      [&](absl::Time) { return ++calls < 3 ? absl::UnavailableError("down") : absl::OkStatus(); });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
  EXPECT_THAT(delays.size(), 2u);
}

TEST(Wakeup, SleepEndsOnNotifyOnceThePredicateTurnsFalse) {
  Wakeup wakeup(RealClock::Get());
  std::atomic<bool> go{true};
  std::atomic<int> result{-1};
  std::thread sleeper(
      [&] { result = wakeup.SleepFor(absl::Hours(1), [&] { return go.load(); }) ? 1 : 0; });
  go = false;
  wakeup.Notify();
  sleeper.join();  // would take an hour without the Notify
  EXPECT_EQ(result.load(), 0);
  // A predicate that is false from the start returns at once; a short sleep runs out.
  EXPECT_FALSE(wakeup.SleepFor(absl::Hours(1), [] { return false; }));
  EXPECT_TRUE(wakeup.SleepFor(absl::Milliseconds(1), [] { return true; }));
  EXPECT_TRUE(wakeup.SleepFor(absl::Milliseconds(1), nullptr));
}

TEST(Wakeup, MeasuresTheDelayOnTheInjectedClock) {
  FakeClock clock;
  Wakeup wakeup(clock);
  std::atomic<bool> entered{false};
  std::atomic<bool> done{false};
  std::thread sleeper([&] {
    EXPECT_TRUE(wakeup.SleepFor(absl::Minutes(10), [&] {
      entered = true;
      return true;
    }));
    done = true;
  });
  ASSERT_TRUE(shoal::testing::WaitUntil([&] { return entered.load(); }, absl::Seconds(60)));
  clock.Advance(absl::Minutes(4));
  wakeup.Notify();
  // Not over on the fake clock: still sleeping (this can only fail, never pass by chance).
  EXPECT_FALSE(done.load());
  clock.Advance(absl::Minutes(6));
  wakeup.Notify();
  sleeper.join();  // would never return if the wait ignored the clock
  EXPECT_TRUE(done.load());
}

}  // namespace
}  // namespace shoal::rpc
