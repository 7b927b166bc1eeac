#include "libs/gossip/flow_control.h"

#include <algorithm>
#include <utility>

namespace shoal::gossip {

FlowControl::FlowControl(FlowControlOptions options, uint64_t seed)
    : options_(std::move(options)), rng_(seed) {}

void FlowControl::SetPeers(const std::vector<std::string>& peers) {
  std::map<std::string, PeerScore> next;
  for (const std::string& id : peers) {
    auto it = peers_.find(id);
    if (it != peers_.end()) {
      next.emplace(id, it->second);
    } else {
      PeerScore fresh;
      fresh.score = options_.initial;
      next.emplace(id, fresh);
    }
  }
  peers_ = std::move(next);
}

std::optional<std::string> FlowControl::Choose(absl::Time now) {
  // A peer whose demotion expired gets its probe first (the one waiting longest).
  const std::string* probe = nullptr;
  absl::Time probe_since = absl::InfiniteFuture();
  for (const auto& [id, p] : peers_) {
    if (p.probation && p.eligible_at <= now && p.eligible_at < probe_since) {
      probe = &id;
      probe_since = p.eligible_at;
    }
  }
  if (probe != nullptr) return *probe;

  std::uniform_real_distribution<double> random_term(options_.random_min, options_.random_max);
  const std::string* best = nullptr;
  double best_value = 0;
  for (const auto& [id, p] : peers_) {
    if (p.eligible_at > now) continue;
    const double value = p.score + random_term(rng_);
    if (best == nullptr || value > best_value) {
      best = &id;
      best_value = value;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

absl::Duration FlowControl::DemotionFor(uint32_t failures) const {
  absl::Duration d = options_.demote_initial;
  for (uint32_t i = 1; i < failures && d < options_.demote_max; ++i) d *= 2;
  return std::min(d, options_.demote_max);
}

void FlowControl::Record(const std::string& peer, FetchOutcome outcome, absl::Time now) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  PeerScore& p = it->second;
  switch (outcome) {
    case FetchOutcome::kSuccess:
      p.score = std::min(options_.max, p.score + options_.success_bonus);
      if (p.probation || p.failures > 0) p.score = std::max(p.score, options_.readmit_score);
      p.score = std::clamp(p.score, options_.min, options_.max);
      p.failures = 0;
      p.probation = false;
      p.eligible_at = absl::InfinitePast();
      break;
    case FetchOutcome::kTimeout:
    case FetchOutcome::kRefused:
    case FetchOutcome::kInvalid:
      p.score = std::max(options_.min, p.score - options_.failure_penalty);
      ++p.failures;
      p.probation = true;
      p.eligible_at = now + DemotionFor(p.failures);
      break;
    case FetchOutcome::kNoState:
      p.eligible_at = now + options_.no_state_delay;
      break;
  }
}

std::optional<double> FlowControl::Score(const std::string& peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return std::nullopt;
  return it->second.score;
}

bool FlowControl::Demoted(const std::string& peer, absl::Time now) const {
  auto it = peers_.find(peer);
  return it != peers_.end() && it->second.failures > 0 && it->second.eligible_at > now;
}

FlowControl::Summary FlowControl::Summarize(absl::Time now) const {
  Summary s;
  s.peers = peers_.size();
  if (peers_.empty()) return s;
  double sum = 0;
  bool first = true;
  for (const auto& [id, p] : peers_) {
    if (p.failures > 0 && p.eligible_at > now) ++s.demoted;
    sum += p.score;
    s.min = first ? p.score : std::min(s.min, p.score);
    s.max = first ? p.score : std::max(s.max, p.score);
    first = false;
  }
  s.mean = sum / static_cast<double>(peers_.size());
  return s;
}

}  // namespace shoal::gossip
