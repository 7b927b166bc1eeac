#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "services/peer_agent/gossip_metrics.h"

namespace shoal::peer {

// The peer agent's Prometheus metrics. Built once from the server's registry and shared by the
// agent, the session client and the PeerService; prometheus-cpp metrics are thread-safe.
struct PeerMetrics {
  explicit PeerMetrics(prometheus::Registry& registry);

  prometheus::Counter& rounds_completed;    // shoal_peer_rounds_completed_total
  prometheus::Gauge& train_loss;            // shoal_peer_train_loss (last round)
  prometheus::Gauge& test_accuracy;         // shoal_peer_test_accuracy (last evaluation)
  prometheus::Counter& bytes_sent;          // shoal_peer_bytes_sent_total
  prometheus::Counter& update_bytes_sent;   // shoal_peer_update_bytes_sent_total
  prometheus::Counter& update_bytes_raw;    // shoal_peer_update_bytes_raw_total
  prometheus::Counter& bytes_received;      // shoal_peer_bytes_received_total
  prometheus::Histogram& round_duration;    // shoal_peer_round_duration_seconds
  prometheus::Counter& updates_rejected;    // shoal_peer_updates_rejected_total
  prometheus::Counter& samples_trained;     // shoal_peer_samples_trained_total
  prometheus::Gauge& connected;             // shoal_peer_connected (1 while the session is up)
  prometheus::Counter& rounds_abandoned;    // shoal_peer_rounds_abandoned_total
  prometheus::Counter& session_reconnects;  // shoal_peer_session_reconnects_total
  prometheus::Gauge& supernode;             // shoal_peer_supernode (1 while it runs one)
  // PeerService (all modes):
  prometheus::Counter& snapshots_served;   // shoal_peer_snapshots_served_total
  prometheus::Counter& snapshots_aborted;  // shoal_peer_snapshots_aborted_total
  // PeerClient (decentralized and gossip):
  prometheus::Counter& peer_bytes_pulled;    // shoal_peer_peer_bytes_pulled_total
  prometheus::Counter& peer_fetches_failed;  // shoal_peer_peer_fetches_failed_total
  prometheus::Counter& snapshots_rejected;   // shoal_peer_snapshots_rejected_total (bad layout)
  // Decentralized mode:
  prometheus::Counter& rounds_joined;       // shoal_peer_decentralized_rounds_joined_total
  prometheus::Counter& rounds_refused;      // shoal_peer_decentralized_rounds_refused_total
  prometheus::Counter& probes_failed;       // shoal_peer_decentralized_probes_failed_total
  prometheus::Counter& sync_transfers;      // shoal_peer_decentralized_sync_transfers_total
  prometheus::Counter& sync_failures;       // shoal_peer_decentralized_sync_failures_total
  prometheus::Histogram& sharing_duration;  // shoal_peer_decentralized_sharing_duration_seconds
  prometheus::Counter& updates_excluded;    // shoal_peer_decentralized_updates_excluded_total
  // Federated-async mode:
  prometheus::Counter& async_pushes_accepted;     // shoal_peer_async_pushes_accepted_total
  prometheus::Counter& async_stale_refusals;      // shoal_peer_async_stale_refusals_total
  prometheus::Counter& async_versions_evaluated;  // shoal_peer_async_versions_evaluated_total
  prometheus::Counter& async_restarts;            // shoal_peer_async_restarts_total
  // Gossip mode (services/peer_agent/gossip_metrics.h):
  GossipPeerMetrics gossip;
};

}  // namespace shoal::peer
