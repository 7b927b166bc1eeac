#include "services/coordinator/modes/federated_sync/straggler_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::coordinator {
namespace {

absl::Duration Median(std::vector<absl::Duration> times) {
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.2fs", absl::ToDoubleSeconds(d)); }

}  // namespace

std::vector<StragglerTracker::Move> StragglerTracker::OnRoundClosed(
    const std::map<std::string, std::optional<absl::Duration>>& sync_times,
    const std::map<std::string, absl::Duration>& late_times) {
  std::vector<Move> moves;
  if (!enabled()) return moves;
  std::vector<absl::Duration> arrived;
  for (const auto& [peer, time] : sync_times) {
    if (time.has_value()) arrived.push_back(*time);
  }
  if (arrived.size() < 2) return moves;  // nothing to compare with
  const absl::Duration median = Median(arrived);
  const absl::Duration bound = median * factor_;
  const std::string against =
      absl::StrCat(absl::StrFormat("%g", factor_), "x the median of ", Seconds(median));

  size_t sync_left = sync_times.size();
  for (const auto& [peer, time] : sync_times) {
    if (async_.count(peer) > 0) continue;
    Pace& pace = pace_[peer];
    pace.fast = 0;
    const bool slow = !time.has_value() || *time > bound;
    pace.slow = slow ? pace.slow + 1 : 0;
    if (pace.slow < rounds_ || sync_left <= 1) continue;
    --sync_left;
    pace.slow = 0;
    async_.insert(peer);
    moves.push_back(
        Move{peer, true,
             absl::StrCat(rounds_, " round(s) in a row slower than ", against,
                          time.has_value() ? absl::StrCat(" (last: ", Seconds(*time), ")")
                                           : std::string(" (last: missed the round)"))});
  }
  for (const auto& [peer, time] : late_times) {
    if (async_.count(peer) == 0) continue;
    Pace& pace = pace_[peer];
    pace.slow = 0;
    pace.fast = time <= bound ? pace.fast + 1 : 0;
    if (pace.fast < rounds_) continue;
    pace.fast = 0;
    async_.erase(peer);
    moves.push_back(Move{peer, false,
                         absl::StrCat(rounds_, " update(s) in a row within ", against,
                                      " (last: ", Seconds(time), ")")});
  }
  return moves;
}

void StragglerTracker::Remove(const std::string& peer) {
  pace_.erase(peer);
  async_.erase(peer);
}

}  // namespace shoal::coordinator
