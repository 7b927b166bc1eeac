#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

namespace shoal::coordinator {

// Coordinator metrics of federated-sync tasks (no peer or task labels). Part of
// CoordinatorMetrics (`metrics.federated_sync`); prometheus-cpp metrics are thread-safe.
struct FederatedSyncTaskMetrics {
  explicit FederatedSyncTaskMetrics(prometheus::Registry& registry);

  // Stragglers moved out of the rounds and back: {direction} to_async, to_sync.
  prometheus::Family<prometheus::Counter>& straggler_moves;
};

}  // namespace shoal::coordinator
