#include "tests/bench/sim_rounds.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/proc_stats.h"
#include "tests/bench/secure_light.h"

namespace shoal::bench {

Latencies Measure(const std::map<uint64_t, RoundTimes>& rounds, size_t peers) {
  Latencies l;
  for (const auto& [round, t] : rounds) {
    if (t.started.size() != peers || t.pushed.size() != peers || t.published.size() != peers) {
      continue;  // the round in progress at the end, or one the fleet joined late
    }
    ++l.rounds;
    const double first_start = *std::min_element(t.started.begin(), t.started.end());
    const double last_push = *std::max_element(t.pushed.begin(), t.pushed.end());
    const double last_publish = *std::max_element(t.published.begin(), t.published.end());
    l.round_ms.push_back((last_publish - first_start) * 1e3);
    for (double s : t.started) l.fanout_ms.push_back((s - first_start) * 1e3);
    for (double p : t.published) l.publish_ms.push_back((p - last_push) * 1e3);
  }
  return l;
}

RoundCost::RoundCost(std::function<double()> aggregators_cpu)
    : aggregators_cpu_(std::move(aggregators_cpu)) {}

int RoundCost::Update(int complete) {
  if (complete < 1 || complete == last_) return std::max(0, last_ - first_);
  const double aggregators = aggregators_cpu_();
  const double self = CpuSeconds(getpid());
  if (first_ < 0) {
    first_ = complete;
    aggregators_start_ = aggregators;
    self_start_ = self;
  }
  last_ = complete;
  aggregators_end_ = aggregators;
  self_end_ = self;
  return last_ - first_;
}

void RoundCost::Print(const std::string& name, const Fleet& fleet, const Latencies& l) const {
  const int rounds = std::max(0, last_ - first_);
  const int peers = fleet.peers();
  const double calls = std::max<int64_t>(1, fleet.update_calls());
  if (rounds == 0) {
    std::printf("%s: cost: fewer than 2 rounds completed, nothing to measure\n", name.c_str());
    return;
  }
  const double self = (self_end_ - self_start_) / rounds;
  std::printf(
      "%s: cost: %d peers%s, %d dropping after masking: round p50 %.1f ms (%d rounds); per round "
      "(%d measured, after the first): aggregators CPU %.3f s, this process CPU %.3f s = %.4f s a "
      "peer; a peer's update call sent %.0f bytes, received %.0f (mean of %lld calls)\n",
      name.c_str(), peers, fleet.secure() ? " secure" : " plain", fleet.dropping(),
      Percentile(l.round_ms, 0.5), l.rounds, rounds,
      (aggregators_end_ - aggregators_start_) / rounds, self, self / std::max(1, peers),
      static_cast<double>(fleet.update_bytes_sent()) / calls,
      static_cast<double>(fleet.update_bytes_received()) / calls,
      static_cast<long long>(fleet.update_calls()));
  if (!fleet.secure()) return;
  std::string steps;
  for (int step = 0; step < BenchSecureParty::kSteps; ++step) {
    absl::StrAppend(&steps, step == 0 ? "" : ", ", BenchSecureParty::StepName(step), " ",
                    absl::StrFormat("%.1f", 1e3 * fleet.secure_step_seconds(step) / calls));
  }
  std::printf("%s: cost: a peer's CPU in SecureParticipant per round, ms by step: %s\n",
              name.c_str(), steps.c_str());
}

}  // namespace shoal::bench
