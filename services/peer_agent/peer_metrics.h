#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "services/peer_agent/modes/decentralized/decentralized_metrics.h"
#include "services/peer_agent/modes/federated_async/federated_async_metrics.h"
#include "services/peer_agent/modes/gossip/gossip_metrics.h"

namespace shoal::peer {

// The peer agent's Prometheus metrics. Built once from the server's registry and shared by the
// agent, the session client and the PeerService; prometheus-cpp metrics are thread-safe.
struct PeerMetrics {
  explicit PeerMetrics(prometheus::Registry& registry);

  prometheus::Counter& rounds_completed;   // shoal_peer_rounds_completed_total
  prometheus::Gauge& train_loss;           // shoal_peer_train_loss (last round)
  prometheus::Gauge& test_accuracy;        // shoal_peer_test_accuracy (last evaluation)
  prometheus::Counter& bytes_sent;         // shoal_peer_bytes_sent_total
  prometheus::Counter& update_bytes_sent;  // shoal_peer_update_bytes_sent_total
  prometheus::Counter& update_bytes_raw;   // shoal_peer_update_bytes_raw_total
  prometheus::Counter& bytes_received;     // shoal_peer_bytes_received_total
  prometheus::Histogram& round_duration;   // shoal_peer_round_duration_seconds
  prometheus::Counter& updates_rejected;   // shoal_peer_updates_rejected_total
  prometheus::Counter& samples_trained;    // shoal_peer_samples_trained_total
  prometheus::Gauge& connected;            // shoal_peer_connected (1 while the session is up)
  prometheus::Counter& rounds_abandoned;   // shoal_peer_rounds_abandoned_total
  // shoal_peer_evaluation_wait_seconds_total (federated-sync, evaluating beside training)
  prometheus::Counter& evaluation_wait;
  prometheus::Counter& session_reconnects;  // shoal_peer_session_reconnects_total
  prometheus::Gauge& supernode;             // shoal_peer_supernode (1 while it runs one)
  // PeerService (all modes):
  prometheus::Counter& snapshots_served;   // shoal_peer_snapshots_served_total
  prometheus::Counter& snapshots_aborted;  // shoal_peer_snapshots_aborted_total
  // shoal_peer_serve_pacing_bytes_per_second (the rate of the last stream served; 0: unpaced)
  prometheus::Gauge& serve_pacing_rate;
  // PeerClient (decentralized and gossip):
  prometheus::Counter& peer_bytes_pulled;    // shoal_peer_peer_bytes_pulled_total
  prometheus::Counter& peer_fetches_failed;  // shoal_peer_peer_fetches_failed_total
  prometheus::Counter& snapshots_rejected;   // shoal_peer_snapshots_rejected_total (bad layout)
  // The modes' own (services/peer_agent/modes/<mode>/):
  DecentralizedPeerMetrics decentralized;
  FederatedAsyncPeerMetrics federated_async;
  GossipPeerMetrics gossip;
};

}  // namespace shoal::peer
