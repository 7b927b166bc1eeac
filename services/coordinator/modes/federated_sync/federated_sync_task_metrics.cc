#include "services/coordinator/modes/federated_sync/federated_sync_task_metrics.h"

namespace shoal::coordinator {

FederatedSyncTaskMetrics::FederatedSyncTaskMetrics(prometheus::Registry& registry)
    : straggler_moves(prometheus::BuildCounter()
                          .Name("shoal_coordinator_straggler_moves_total")
                          .Help("Federated-sync peers moved to asynchronous contribution "
                                "(direction=to_async) and back (to_sync)")
                          .Register(registry)) {}

}  // namespace shoal::coordinator
