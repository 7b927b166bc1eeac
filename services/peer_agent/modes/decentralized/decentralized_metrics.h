#pragma once

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shoal::peer {

// Decentralized-mode metrics of a peer (no peer-id labels). Part of PeerMetrics
// (`metrics.decentralized`); prometheus-cpp metrics are thread-safe.
struct DecentralizedPeerMetrics {
  explicit DecentralizedPeerMetrics(prometheus::Registry& registry);

  prometheus::Counter& rounds_joined;       // shoal_peer_decentralized_rounds_joined_total
  prometheus::Counter& rounds_refused;      // shoal_peer_decentralized_rounds_refused_total
  prometheus::Counter& probes_failed;       // shoal_peer_decentralized_probes_failed_total
  prometheus::Counter& sync_transfers;      // shoal_peer_decentralized_sync_transfers_total
  prometheus::Counter& sync_failures;       // shoal_peer_decentralized_sync_failures_total
  prometheus::Histogram& sharing_duration;  // shoal_peer_decentralized_sharing_duration_seconds
  prometheus::Counter& updates_excluded;    // shoal_peer_decentralized_updates_excluded_total
  prometheus::Counter& updates_spilled;     // shoal_peer_decentralized_updates_spilled_total
};

}  // namespace shoal::peer
