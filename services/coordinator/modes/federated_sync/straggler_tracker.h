#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace shoal::coordinator {

// Which peers of a federated-sync task hold its rounds and which contribute asynchronously
// (TaskSpec.straggler_factor, straggler_rounds; docs/explanation/federated-sync.md, "Stragglers").
//
// After every round: a peer that holds the rounds (sync) and took longer than factor x the
// median of the round's sync times, or missed the round, is slow; `rounds` slow rounds in a row
// move it to asynchronous contribution. An async peer whose late update took (from the event
// that started it to its acceptance) at most factor x that round's median is fast; `rounds`
// fast updates in a row move it back. Judging needs the times of at least two sync peers, and
// the last sync peer never moves. Plain state; not thread-safe.
class StragglerTracker {
 public:
  struct Move {
    std::string peer;
    bool to_async = false;
    std::string why;  // e.g. "2 rounds in a row over 2x the median (12.1s against 4.02s)"
  };

  // factor 0: off (nobody ever moves).
  StragglerTracker(double factor, uint32_t rounds) : factor_(factor), rounds_(rounds) {}

  bool enabled() const { return factor_ > 0; }
  bool IsAsync(const std::string& peer) const { return async_.count(peer) > 0; }
  const std::set<std::string>& async_peers() const { return async_; }

  // A round closed. `sync_times`: each sync peer the round waited for, with its time from the
  // open to its accepted update, or nullopt when it missed the round. `late_times`: each async
  // peer whose late update was accepted since the last close, with its time. Returns the moves,
  // already applied.
  std::vector<Move> OnRoundClosed(
      const std::map<std::string, std::optional<absl::Duration>>& sync_times,
      const std::map<std::string, absl::Duration>& late_times);

  // The peer left the task: forgets it.
  void Remove(const std::string& peer);

 private:
  struct Pace {
    uint32_t slow = 0;  // sync: slow rounds in a row
    uint32_t fast = 0;  // async: fast updates in a row
  };

  const double factor_;
  const uint32_t rounds_;
  std::map<std::string, Pace> pace_;
  std::set<std::string> async_;
};

}  // namespace shoal::coordinator
