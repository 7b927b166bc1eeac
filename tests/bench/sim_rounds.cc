#include "tests/bench/sim_rounds.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/proc_stats.h"
#include "tests/bench/raw_tcp.h"
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

absl::Status PrintDataPath(const std::string& name, const std::map<uint64_t, RoundTimes>& rounds,
                           int peers, int64_t model_bytes, pid_t aggregator, int max_pushes) {
  std::vector<double> round_s, open_s;
  double published = -1;  // the previous round's first ModelPublished
  for (const auto& [round, t] : rounds) {
    const bool complete = t.started.size() == static_cast<size_t>(peers) &&
                          t.downloaded.size() == static_cast<size_t>(peers);
    const double first =
        t.started.empty() ? -1 : *std::min_element(t.started.begin(), t.started.end());
    if (published >= 0 && first >= 0) open_s.push_back(first - published);
    if (complete && round > 1) {  // round 1 also pulls the initial model
      round_s.push_back(*std::max_element(t.downloaded.begin(), t.downloaded.end()) - first);
    }
    published =
        t.published.empty() ? -1 : *std::min_element(t.published.begin(), t.published.end());
  }
  if (round_s.empty())
    return absl::FailedPreconditionError(name + ": no complete round to measure");
  std::vector<char> model(static_cast<size_t>(model_bytes), 1), sink(model.size(), 1);
  std::vector<double> tcp_s;
  for (int rep = 0; rep < 3; ++rep) {
    tcp_s.push_back(RawTcpSeconds(model.data(), model.size(), 1 << 20, sink));
  }
  const double tcp_round = 2.0 * peers * Percentile(tcp_s, 0.5);
  const double round = Percentile(round_s, 0.5);
  const double hwm = StatusMiB(aggregator, "VmHWM");
  const double model_mib = static_cast<double>(model_bytes) / (1 << 20);
  std::printf(
      "%s: data path: %.0f MB model, %d peers, %zu rounds measured: round (first RoundStarted "
      "-> every peer holding the new version) p50 %.2f s, min %.2f s; the same %.2f GB over "
      "raw TCP one after another %.2f s (%.2f GB/s): ratio %.2f\n",
      name.c_str(), static_cast<double>(model_bytes) / 1e6, peers, round_s.size(), round,
      *std::min_element(round_s.begin(), round_s.end()),
      2.0 * peers * static_cast<double>(model_bytes) / 1e9, tcp_round,
      static_cast<double>(model_bytes) / 1e9 / Percentile(tcp_s, 0.5), round / tcp_round);
  if (!open_s.empty()) {
    std::printf(
        "%s: from a round's ModelPublished to the next round's RoundStarted (the "
        "version's checkpoint runs meanwhile): p50 %.0f ms (%.1f%% of the round)\n",
        name.c_str(), Percentile(open_s, 0.5) * 1e3, 100 * Percentile(open_s, 0.5) / round);
  }
  std::printf(
      "%s: aggregator peak RSS %.0f MiB = %.2f x the model (bound: (max concurrent pushes %d "
      "+ 2) x the model = %.0f MiB)\n",
      name.c_str(), hwm, hwm / model_mib, max_pushes, (max_pushes + 2) * model_mib);
  return absl::OkStatus();
}

}  // namespace shoal::bench
