#pragma once

#include "absl/time/time.h"
#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_metrics.h"

namespace shoal::aggregator {

// The fixed part of a copy's bound (rpc::TransferTimeout adds the update's bytes at 1 Mbit/s).
inline constexpr absl::Duration kCopyTimeout = absl::Seconds(30);

// Replicas: sends a primary's copy of an accepted update to each of its backups (PushUpdate with
// UpdateMeta.replicated_by), one after the other, each bounded by kCopyTimeout plus the update's
// bytes at 1 Mbit/s (rpc::TransferTimeout: a large model is not cut off while it still moves,
// nor when the copies of several pushes share the connection to a backup). A backup that fails is
// counted (shoal_aggregator_replications_total{result="failed"}) and logged, and the caller
// answers the peer anyway: the coordinator replaces a lost backup. Blocks; runs on the executor.
void CopyToBackups(const AggregatorCore::Push::Replica& replica, AggregatorClient& client,
                   AggregatorMetrics& metrics);

}  // namespace shoal::aggregator
