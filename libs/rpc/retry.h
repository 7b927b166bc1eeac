#pragma once

// Application-level retries (STYLE.md, "gRPC"): capped exponential backoff with jitter, a bound
// per attempt, a total deadline, and a sleep between attempts that ends early when the caller
// must stop (shutdown, a newer event). Transport-level retries inside one call are the channel's
// (libs/rpc/channel.h); this is for calls a caller repeats itself. Header-only.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"

namespace shoal::rpc {

// Waits between attempts: waits up to `delay`; false means "give up now" (the caller is stopping
// or its work was superseded), and the retry loop returns at once.
using SleepFn = std::function<bool(absl::Duration delay)>;

// Lets waits measured on an injected clock end early when what they wait for may have changed:
// whoever changes it (queues an event, stops, finishes a job) calls Notify(), and every sleeper
// re-checks its predicate. One Wakeup is shared by a worker and whatever waits on its behalf
// (retry loops, parallel calls, a fetch in flight). Owned by the owner of that state (e.g. the
// peer agent); thread-safe.
class Wakeup {
 public:
  explicit Wakeup(const Clock& clock) : clock_(clock) {}
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  // Makes every SleepFor() in progress re-check its predicate now.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++generation_;
  }

  // Waits until `delay` has passed on the clock or `keep_going` returns false. The predicate is
  // checked at the start, after every Notify() and when the delay is up, never under this
  // object's lock (it may take the caller's). Returns its last value (true when it is null):
  // false means the wait was cut short. A fake clock's Advance() wakes nobody by itself: call
  // Notify() after it.
  bool SleepFor(absl::Duration delay, const std::function<bool()>& keep_going) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    const absl::Time until = clock_.Now() + delay;
    while (true) {
      uint64_t seen;
      {
        absl::MutexLock lock(&mu_);
        seen = generation_;  // read before the check: a Notify() after it ends the wait below
      }
      if (keep_going && !keep_going()) return false;
      const absl::Duration left = until - clock_.Now();
      if (left <= absl::ZeroDuration()) return true;
      absl::MutexLock lock(&mu_);
      auto notified = [this, seen]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ != seen; };
      mu_.AwaitWithTimeout(absl::Condition(&notified), left);
    }
  }

  // SleepFor with a fixed predicate, as the sleep of a retry loop.
  SleepFn Sleeper(std::function<bool()> keep_going) const {
    return [this, keep_going = std::move(keep_going)](absl::Duration delay) {
      return SleepFor(delay, keep_going);
    };
  }

  const Clock& clock() const { return clock_; }

 private:
  const Clock& clock_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// UNAVAILABLE and RESOURCE_EXHAUSTED: the callee is down, not ready yet or overloaded, and the
// same call may well succeed a little later.
inline bool IsTransient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsResourceExhausted(status);
}

// The slowest link a transfer of a model or an update is expected to get through: 1 Mbit/s.
inline constexpr double kSlowestLink = 125e3;  // bytes/s

// How long one attempt of a call that moves `bytes` may take: `base` (connecting, the other
// side's work) plus the bytes at `slowest_rate` (bytes/s), so that a large model over a slow or
// busy link is not cut off while it still moves, and a stalled one still ends.
inline absl::Duration TransferTimeout(absl::Duration base, uint64_t bytes,
                                      double slowest_rate = kSlowestLink) {
  return base + absl::Seconds(static_cast<double>(bytes) / slowest_rate);
}

struct RetryOptions {
  BackoffOptions backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};
  // Bound of one attempt (the total deadline may cut it shorter). Infinite: the deadline alone.
  absl::Duration attempt_timeout = absl::InfiniteDuration();
  // At most this many attempts; 0: as many as the deadline allows.
  int max_attempts = 0;
  // Which failures are worth another attempt; null: IsTransient.
  std::function<bool(const absl::Status&)> retryable;
};

namespace retry_internal {
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}
// Whether a failed attempt number `attempts` (from 1) may be followed by another one.
// `cut_by_its_bound`: it ended DEADLINE_EXCEEDED with a bound of its own, before the deadline.
inline bool MayRetry(const RetryOptions& options, const absl::Status& status, int attempts,
                     bool cut_by_its_bound) {
  if (status.ok()) return false;
  if (options.max_attempts > 0 && attempts >= options.max_attempts) return false;
  if (options.retryable) return options.retryable(status);
  return IsTransient(status) || cut_by_its_bound;
}
}  // namespace retry_internal

// Calls attempt(attempt_deadline), with attempt_deadline = min(deadline, now + attempt_timeout),
// until it succeeds, fails with an error `retryable` rejects, max_attempts are used, the next
// attempt would start at or after `deadline`, or `sleep` returns false. Without `retryable`, an
// attempt is retried when it failed transiently (IsTransient) or ran out of its own time
// (DEADLINE_EXCEEDED with an attempt_deadline before `deadline`): one attempt held up by a
// stalled connection or a busy callee does not use up a deadline that has room for more. Between
// two attempts it sleeps the next backoff delay (jittered, growing to the cap). Returns the last
// attempt's result. `attempt` returns absl::Status or absl::StatusOr<T>; time comes from `clock`.
template <typename Attempt>
auto Retry(const Clock& clock, const RetryOptions& options, absl::Time deadline,
           const SleepFn& sleep, Attempt&& attempt) -> std::invoke_result_t<Attempt&, absl::Time> {
  Backoff backoff(options.backoff);
  for (int attempts = 1;; ++attempts) {
    const absl::Time attempt_deadline = std::min(deadline, clock.Now() + options.attempt_timeout);
    std::invoke_result_t<Attempt&, absl::Time> result = attempt(attempt_deadline);
    const absl::Status& status = retry_internal::StatusOf(result);
    const bool cut_by_its_bound = absl::IsDeadlineExceeded(status) && attempt_deadline < deadline;
    if (!retry_internal::MayRetry(options, status, attempts, cut_by_its_bound)) return result;
    const absl::Duration delay = backoff.Next();
    if (clock.Now() + delay >= deadline || !sleep(delay)) return result;
  }
}

}  // namespace shoal::rpc
