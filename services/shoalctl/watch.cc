#include "services/shoalctl/watch.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/backoff.h"
#include "services/shoalctl/task_format.h"

namespace shoal::shoalctl::internal {
namespace {

using coordinator::v1::TaskStatus;

// A watch is a long call; it still gets a deadline, far beyond any sensible task.
constexpr absl::Duration kWatchDeadline = absl::Hours(24 * 7);
// How long `task watch` keeps reconnecting after losing the coordinator.
constexpr absl::Duration kReconnectBudget = absl::Seconds(60);

// Sleeps up to `d`, returning early when interrupted.
void InterruptibleSleep(absl::Duration d, const Interrupt* interrupt) {
  const absl::Time end = absl::Now() + d;
  while (absl::Now() < end) {
    if (interrupt != nullptr && interrupt->interrupted.load()) return;
    absl::SleepFor(std::min(absl::Milliseconds(50), end - absl::Now()));
  }
}

}  // namespace

void ProgressPrinter::Update(const TaskStatus& status) {
  std::string line = tty_ ? FormatProgressLine(status) : FormatProgressLogLine(status);
  // A wrapped line cannot be rewritten with \r.
  if (tty_ && columns_ > 1 && line.size() >= static_cast<size_t>(columns_)) {
    line.resize(static_cast<size_t>(columns_ - 1));
  }
  absl::MutexLock lock(&mu_);
  if (tty_) {
    out_ << "\r" << line << "\x1b[K" << std::flush;
  } else if (line != last_) {
    out_ << line << "\n" << std::flush;
  }
  last_ = line;
}

void ProgressPrinter::Note(const std::string& text) {
  absl::MutexLock lock(&mu_);
  if (tty_ && !last_.empty()) {
    out_ << "\r\x1b[K" << text << "\n" << last_ << std::flush;
  } else {
    out_ << text << "\n" << std::flush;
  }
}

void ProgressPrinter::Finish() {
  absl::MutexLock lock(&mu_);
  if (tty_ && !last_.empty()) out_ << "\n" << std::flush;
  last_.clear();
}

absl::StatusOr<TaskStatus> WatchUntilEnd(ControlClientInterface& client, const std::string& name,
                                         ProgressPrinter& printer, Environment& env,
                                         const std::string& coordinator) {
  Canceller local_canceller;
  Canceller* canceller = env.interrupt != nullptr ? &env.interrupt->canceller : &local_canceller;
  Backoff backoff(BackoffOptions{.initial = absl::Milliseconds(200), .max = absl::Seconds(5)});
  std::optional<TaskStatus> last;
  std::optional<absl::Time> retry_until;
  while (true) {
    absl::StatusOr<TaskStatus> result = client.WatchTask(
        name, kWatchDeadline,
        [&](const TaskStatus& status) {
          last = status;
          retry_until.reset();
          backoff.Reset();
          printer.Update(status);
          return !IsTerminal(status.state());
        },
        canceller);
    if (result.ok() && IsTerminal(result->state())) return result;
    if (!result.ok()) {
      const absl::StatusCode code = result.status().code();
      if (code == absl::StatusCode::kCancelled || code == absl::StatusCode::kNotFound ||
          code == absl::StatusCode::kInvalidArgument || !last.has_value()) {
        return result.status();
      }
    }
    // The stream ended or broke while the task still runs: reconnect.
    const absl::Time now = absl::Now();
    if (!retry_until.has_value()) {
      retry_until = now + kReconnectBudget;
      printer.Note(absl::StrCat("lost the watch stream (",
                                result.ok() ? "ended early" : result.status().ToString(),
                                "); reconnecting to ", coordinator));
    } else if (now >= *retry_until) {
      return result.ok() ? absl::UnavailableError("the watch stream keeps ending")
                         : result.status();
    }
    InterruptibleSleep(backoff.Next(), env.interrupt);
    if (canceller->cancelled()) return absl::CancelledError("cancelled");
  }
}
}  // namespace shoal::shoalctl::internal
