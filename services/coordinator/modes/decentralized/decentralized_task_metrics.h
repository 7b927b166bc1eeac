#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shoal::coordinator {

// Coordinator metrics of decentralized rounds (no peer or task labels). Part of
// CoordinatorMetrics (`metrics.decentralized`); prometheus-cpp metrics are thread-safe.
struct DecentralizedTaskMetrics {
  explicit DecentralizedTaskMetrics(prometheus::Registry& registry);

  prometheus::Counter& joins;               // JoinRound accepted
  prometheus::Counter& leaves;              // round members that left or crashed
  prometheus::Counter& connection_retries;  // PeerLists re-sent after failures
  prometheus::Counter& removed_peers;       // ConnectionFailed sent
  prometheus::Counter& sync_transfers;      // model syncs that succeeded
  prometheus::Counter& sync_failures;       // SyncDone !ok, provider lost, timeout
  prometheus::Counter& digest_mismatches;   // participants disagreeing on a model
  prometheus::Histogram& sync_duration;     // successful model syncs
  prometheus::Gauge& round_participants;    // of the last completed round
  prometheus::Histogram& round_overhead;    // first ready -> last SharingDone
};

}  // namespace shoal::coordinator
