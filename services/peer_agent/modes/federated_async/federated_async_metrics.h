#pragma once

#include <prometheus/counter.h>
#include <prometheus/registry.h>

namespace shoal::peer {

// Federated-async metrics of a peer (no peer-id labels). Part of PeerMetrics
// (`metrics.federated_async`); prometheus-cpp metrics are thread-safe.
struct FederatedAsyncPeerMetrics {
  explicit FederatedAsyncPeerMetrics(prometheus::Registry& registry);

  prometheus::Counter& pushes_accepted;     // shoal_peer_async_pushes_accepted_total
  prometheus::Counter& stale_refusals;      // shoal_peer_async_stale_refusals_total
  prometheus::Counter& versions_evaluated;  // shoal_peer_async_versions_evaluated_total
  prometheus::Counter& restarts;            // shoal_peer_async_restarts_total
};

}  // namespace shoal::peer
