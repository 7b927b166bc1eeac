#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

namespace shoal::coordinator {

// Coordinator metrics of gossip tasks (no peer or task labels). Part of CoordinatorMetrics
// (`metrics.gossip`); prometheus-cpp metrics are thread-safe.
struct GossipTaskMetrics {
  explicit GossipTaskMetrics(prometheus::Registry& registry);

  prometheus::Gauge& members;               // shoal_coordinator_gossip_members
  prometheus::Counter& membership_updates;  // shoal_coordinator_gossip_membership_updates_total
  prometheus::Counter& progress_reports;    // shoal_coordinator_gossip_progress_reports_total
  prometheus::Counter& peers_done;          // shoal_coordinator_gossip_peers_done_total
  prometheus::Counter& peer_fetches;        // shoal_coordinator_gossip_peer_fetches_total
  prometheus::Counter& peer_bytes_pulled;   // shoal_coordinator_gossip_peer_bytes_pulled_total
  prometheus::Gauge& slowest_step;          // shoal_coordinator_gossip_slowest_step
  prometheus::Gauge& mean_loss;             // shoal_coordinator_gossip_mean_loss
};

}  // namespace shoal::coordinator
