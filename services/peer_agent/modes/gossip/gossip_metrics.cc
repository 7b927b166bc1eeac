#include "services/peer_agent/modes/gossip/gossip_metrics.h"

#include <string>

#include "libs/metrics/builders.h"

namespace shoal::peer {

using metrics::Counter;
using metrics::Gauge;
using metrics::Histogram;

namespace {

constexpr char kFailed[] = "shoal_peer_gossip_fetches_failed_total";
constexpr char kFailedHelp[] =
    "Gossip fetches that failed, by reason: refused (unreachable, unavailable, other errors), "
    "invalid (mismatched or non-finite snapshot, or farther than max_update_norm), no_state (the "
    "peer has published nothing yet).";
constexpr char kScore[] = "shoal_peer_gossip_peer_score";
constexpr char kScoreHelp[] =
    "Flow-control scores of this peer's gossip candidates: min, mean and max over the members.";

}  // namespace

GossipPeerMetrics::GossipPeerMetrics(prometheus::Registry& r)
    : fetches_started(Counter(r, "shoal_peer_gossip_fetches_started_total",
                              "Gossip fetches of a peer's snapshot started.")),
      fetches_succeeded(Counter(r, "shoal_peer_gossip_fetches_succeeded_total",
                                "Gossip fetches that delivered a valid snapshot in time.")),
      fetches_timed_out(Counter(r, "shoal_peer_gossip_fetches_timed_out_total",
                                "Gossip fetches that ran past timeout_ms.")),
      fetches_refused(Counter(r, kFailed, kFailedHelp, {{"reason", "refused"}})),
      fetches_invalid(Counter(r, kFailed, kFailedHelp, {{"reason", "invalid"}})),
      fetches_no_state(Counter(r, kFailed, kFailedHelp, {{"reason", "no_state"}})),
      bytes_pulled(Counter(r, "shoal_peer_gossip_bytes_pulled_total",
                           "Tensor payload bytes of the snapshots gossip fetched.")),
      steps(Counter(r, "shoal_peer_gossip_steps_total", "Gossip training steps (batches).")),
      interpolation_factor(Histogram(r, "shoal_peer_gossip_interpolation_factor",
                                     "Interpolation factor f of each mix (p = f*peer + ...).",
                                     {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0})),
      fetch_duration(Histogram(
          r, "shoal_peer_gossip_fetch_duration_seconds", "Duration of successful gossip fetches.",
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5})),
      wait_duration(Histogram(r, "shoal_peer_gossip_fetch_wait_seconds",
                              "Time training waited for a fetch after its step.",
                              {0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5})),
      clock(Gauge(r, "shoal_peer_gossip_clock", "This peer's gossip clock (interpolated steps).")),
      score_min(Gauge(r, kScore, kScoreHelp, {{"stat", "min"}})),
      score_mean(Gauge(r, kScore, kScoreHelp, {{"stat", "mean"}})),
      score_max(Gauge(r, kScore, kScoreHelp, {{"stat", "max"}})),
      peers(Gauge(r, "shoal_peer_gossip_peers", "Gossip candidates (members but this peer).")),
      peers_demoted(Gauge(r, "shoal_peer_gossip_peers_demoted",
                          "Gossip candidates demoted after failures, waiting out a backoff.")),
      peer_distance(Gauge(r, "shoal_peer_gossip_peer_distance",
                          "L2 distance between this model and the peer's at the last exchange "
                          "(consensus distance is about this / sqrt(2)).")) {}

}  // namespace shoal::peer
