#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/coordinator/mode_task.h"

namespace shoal::coordinator {

// Tells a task's peers, while it waits for min_participants, how many it has and needs: the
// Waiting event, the task's WAITING state and its message ("waiting for peers: have 3, need 4").
//
// A peer that joins hears at once. The others hear a changed count at most once per `interval`
// (the core's Step ticks the mode at least every 100 ms, so the last change is never left
// untold for longer), and the status is persisted at that pace. Telling every peer on every
// join made N joins cost N²/2 events: 50 million for 10,000 peers.
// Not thread-safe: driven under the core's lock like the mode that holds it.
class WaitingNotice {
 public:
  explicit WaitingNotice(absl::Duration interval = absl::Seconds(1)) : interval_(interval) {}

  // `peer` joined: the next Update tells it at once.
  void Joined(const std::string& peer) { joined_.push_back(peer); }
  // The task waits: `peers` are all its peers, `need` its min_participants. True when it told
  // every peer (and set the status) this time.
  bool Update(const std::set<std::string>& peers, uint32_t need, absl::Time now,
              v1::TaskStatus& status, ModeEffects& fx);
  // The task stopped waiting: the next wait is told from scratch.
  void Clear();

 private:
  const absl::Duration interval_;
  std::vector<std::string> joined_;  // since the last Update
  bool told_ = false;                // a broadcast since the last Clear
  size_t told_have_ = 0;
  uint32_t told_need_ = 0;
  absl::Time told_at_ = absl::InfinitePast();
};

}  // namespace shoal::coordinator
