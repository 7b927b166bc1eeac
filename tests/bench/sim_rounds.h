#pragma once

// shoal-sim's figures over whole rounds: the latencies of round events over the rounds every peer
// finished, and what a round costs (CPU, the bytes of each peer's update call).

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/bench/light_peer.h"

namespace shoal::bench {

// Round-event latencies of one phase, in milliseconds, over the rounds every peer finished.
struct Latencies {
  int rounds = 0;
  std::vector<double> round_ms;    // first RoundStarted -> last ModelPublished
  std::vector<double> fanout_ms;   // each RoundStarted arrival - the round's first one
  std::vector<double> publish_ms;  // each ModelPublished arrival - the round's last accepted push
};

Latencies Measure(const std::map<uint64_t, RoundTimes>& rounds, size_t peers);

// CPU per round over whole rounds: from the first Update that sees a round complete (the first
// round is the warm-up: channels, first allocations) to the last Update, the aggregators' CPU and
// this process's (the light peers', with the coordinator's when it is hosted here), divided by
// the rounds completed in between. Each Update is at a poll, not at a round's end; both ends of
// the window are alike (the next round begun), so their parts of a round mostly cancel out.
// With --model-mb: a round moves, per peer, its update up and the new version down (the version
// a round starts from is the one each peer pulled after the last publish). Prints its time, first
// RoundStarted to the last peer holding the new version, against those bytes sent one after
// another over one raw loopback TCP connection, and the aggregator's peak RSS against its bound
// ((max_pushes + 2) x the model). FAILED_PRECONDITION when no round is complete.
absl::Status PrintDataPath(const std::string& name, const std::map<uint64_t, RoundTimes>& rounds,
                           int peers, int64_t model_bytes, pid_t aggregator, int max_pushes);

class RoundCost {
 public:
  // `aggregators_cpu`: the aggregator processes' CPU seconds so far.
  explicit RoundCost(std::function<double()> aggregators_cpu);
  // With the rounds every peer has finished so far; returns the rounds measured.
  int Update(int complete);
  // One line, `<name>: cost: ...` (scripts/bench-privacy reads it): round p50 (of `l`), CPU per
  // round, and each peer's update call (PushUpdate, or SecureAggregate with Options::secure):
  // bytes sent and received, averaged over the phase's calls.
  void Print(const std::string& name, const Fleet& fleet, const Latencies& l) const;

 private:
  const std::function<double()> aggregators_cpu_;
  int first_ = -1;  // rounds complete at the window's start (-1: not started)
  int last_ = -1;
  double aggregators_start_ = 0;
  double aggregators_end_ = 0;
  double self_start_ = 0;
  double self_end_ = 0;
};

}  // namespace shoal::bench
