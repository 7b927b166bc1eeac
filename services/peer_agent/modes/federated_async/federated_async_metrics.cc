#include "services/peer_agent/modes/federated_async/federated_async_metrics.h"

#include "libs/metrics/builders.h"

namespace shoal::peer {

using metrics::Counter;

FederatedAsyncPeerMetrics::FederatedAsyncPeerMetrics(prometheus::Registry& r)
    : pushes_accepted(Counter(r, "shoal_peer_async_pushes_accepted_total",
                              "Federated-async pushes the aggregator's buffer accepted.")),
      stale_refusals(Counter(r, "shoal_peer_async_stale_refusals_total",
                             "Federated-async pushes refused with FAILED_PRECONDITION "
                             "(trained from a version older than max_staleness allows, "
                             "or the buffer is closed) and dropped.")),
      versions_evaluated(Counter(r, "shoal_peer_async_versions_evaluated_total",
                                 "Federated-async model versions evaluated (EvalReports).")),
      restarts(Counter(r, "shoal_peer_async_restarts_total",
                       "Federated-async training stretches again from the version of the "
                       "peer's last push, cut short by a newer version.")) {}

}  // namespace shoal::peer
