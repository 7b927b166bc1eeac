#pragma once

#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_metrics.h"

namespace shoal::aggregator {

// Replicas: sends a primary's copy of an accepted update to each of its backups (PushUpdate with
// UpdateMeta.replicated_by), one after the other, each bounded by 30 s. A backup that fails is
// counted (shoal_aggregator_replications_total{result="failed"}) and logged, and the caller
// answers the peer anyway: the coordinator replaces a lost backup. Blocks; runs on the executor.
void CopyToBackups(const AggregatorCore::Push::Replica& replica, AggregatorClient& client,
                   AggregatorMetrics& metrics);

}  // namespace shoal::aggregator
