#pragma once

// dpwa's flow control of gossip peer choice, with demotion and re-admission instead of dpwa's
// de-facto eviction. No gRPC, no LibTorch.

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "libs/gossip/gossip_spec.h"

namespace shoal::gossip {

// How one exchange with a peer ended.
enum class FetchOutcome {
  kSuccess,  // a valid snapshot arrived in time: score += success_bonus
  kTimeout,  // timeout_ms passed: score -= failure_penalty, demoted
  kRefused,  // connection refused / unavailable / other transport error: as a timeout
  kInvalid,  // the peer sent a mismatched or non-finite snapshot: as a timeout
  kNoState,  // the peer has no snapshot yet: no score change, skipped for no_state_delay
};

// Per-peer scores and the choice of the peer to fetch from.
//
// Every peer starts at `initial`. The chosen peer is the argmax over the eligible peers of
// score + U[random_min, random_max] (so peers with equal scores are picked uniformly, and a
// peer a few penalties down rarely). A failure also demotes the peer: it is not eligible before
// a backoff (demote_initial, doubling per consecutive failure, capped at demote_max). When the
// backoff expires the peer is on probation and is picked first (one probe); a success re-admits
// it with a score of at least readmit_score, a failure demotes it again for longer. dpwa has no
// re-admission: a peer at the minimum score practically never wins the draw again, so it can
// never earn its score back.
//
// Owned by the gossip runner; not thread-safe (the runner's worker thread only).
class FlowControl {
 public:
  FlowControl(FlowControlOptions options, uint64_t seed);

  // The candidate set (this peer excluded by the caller). Known peers keep their state; new
  // ones start at `initial`; peers not listed are forgotten.
  void SetPeers(const std::vector<std::string>& peers);

  // The peer to fetch from now, or nullopt when no peer is eligible.
  std::optional<std::string> Choose(absl::Time now);

  // Records how an exchange with `peer` ended (ignored for unknown peers).
  void Record(const std::string& peer, FetchOutcome outcome, absl::Time now);

  // The peer's score, nullopt when unknown.
  std::optional<double> Score(const std::string& peer) const;
  // Whether `peer` is demoted at `now` (waiting out its backoff).
  bool Demoted(const std::string& peer, absl::Time now) const;

  // A bounded view of all scores (no per-peer detail), for metrics.
  struct Summary {
    size_t peers = 0;
    size_t demoted = 0;  // waiting out a backoff
    double min = 0, mean = 0, max = 0;
  };
  Summary Summarize(absl::Time now) const;

  const FlowControlOptions& options() const { return options_; }

 private:
  struct PeerScore {
    double score = 0;
    uint32_t failures = 0;  // consecutive
    absl::Time eligible_at = absl::InfinitePast();
    bool probation = false;  // demoted before; next success re-admits
  };
  absl::Duration DemotionFor(uint32_t failures) const;

  const FlowControlOptions options_;
  std::mt19937_64 rng_;
  std::map<std::string, PeerScore> peers_;  // ordered: deterministic draws for a seed
};

}  // namespace shoal::gossip
