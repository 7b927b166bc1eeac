#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shoal::peer {

// Gossip-mode metrics of a peer (no peer-id labels). Part of PeerMetrics (`metrics.gossip`);
// prometheus-cpp metrics are thread-safe. Bytes served to other peers are
// shoal_peer_bytes_sent_total / shoal_peer_snapshots_served_total (PeerService): a gossip peer
// serves only its LATEST snapshot.
struct GossipPeerMetrics {
  explicit GossipPeerMetrics(prometheus::Registry& registry);

  prometheus::Counter& fetches_started;    // shoal_peer_gossip_fetches_started_total
  prometheus::Counter& fetches_succeeded;  // shoal_peer_gossip_fetches_succeeded_total
  prometheus::Counter& fetches_timed_out;  // shoal_peer_gossip_fetches_timed_out_total
  // shoal_peer_gossip_fetches_failed_total{reason="refused"|"invalid"|"no_state"}
  prometheus::Counter& fetches_refused;
  prometheus::Counter& fetches_invalid;
  prometheus::Counter& fetches_no_state;
  prometheus::Counter& bytes_pulled;            // shoal_peer_gossip_bytes_pulled_total
  prometheus::Counter& steps;                   // shoal_peer_gossip_steps_total
  prometheus::Histogram& interpolation_factor;  // shoal_peer_gossip_interpolation_factor
  prometheus::Histogram& fetch_duration;        // shoal_peer_gossip_fetch_duration_seconds
  prometheus::Histogram& wait_duration;         // shoal_peer_gossip_fetch_wait_seconds
  prometheus::Gauge& clock;                     // shoal_peer_gossip_clock
  // shoal_peer_gossip_peer_score{stat="min"|"mean"|"max"}: flow-control scores of the members
  prometheus::Gauge& score_min;
  prometheus::Gauge& score_mean;
  prometheus::Gauge& score_max;
  prometheus::Gauge& peers;          // shoal_peer_gossip_peers (candidates)
  prometheus::Gauge& peers_demoted;  // shoal_peer_gossip_peers_demoted
  // shoal_peer_gossip_peer_distance: ||x_local - x_peer|| at the last successful exchange. The
  // consensus distance sqrt(mean_i ||x_i - x̄||²) of n peers is about this / sqrt(2) (a cheap
  // estimate; scripts/bench-gossip computes the exact one from the final models).
  prometheus::Gauge& peer_distance;
};

}  // namespace shoal::peer
