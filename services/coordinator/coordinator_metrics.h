#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "services/coordinator/modes/decentralized/decentralized_task_metrics.h"
#include "services/coordinator/modes/federated_sync/federated_sync_task_metrics.h"
#include "services/coordinator/modes/gossip/gossip_task_metrics.h"

namespace shoal::coordinator {

// The coordinator's Prometheus metrics, registered in an injected registry. Labels are bounded
// (reason, state); never a peer id, task name or round number. prometheus-cpp metrics are
// thread-safe.
struct CoordinatorMetrics {
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  prometheus::Counter& rounds_completed;
  prometheus::Histogram& round_duration;
  prometheus::Gauge& peers_connected;
  prometheus::Gauge& aggregators_registered;
  prometheus::Counter& updates_accepted;
  prometheus::Family<prometheus::Counter>& messages_rejected;  // {reason}
  prometheus::Counter& peers_dropped;                          // expected peers that missed a round
  prometheus::Counter& peers_crashed;                          // streams lost or heartbeats missed
  // Peers past the heartbeat limit not declared crashed because most peers are silent at once.
  prometheus::Gauge& peers_silent_held;
  prometheus::Gauge& train_loss;     // mean train loss of the last closed round
  prometheus::Gauge& test_accuracy;  // test accuracy of the last evaluated model
  // Differential privacy (privacy.dp tasks): epsilon spent, at its delta, by the task of the
  // last round charged (no task label: each task's own is in its status), and rounds charged.
  prometheus::Gauge& privacy_epsilon;
  prometheus::Counter& privacy_rounds;
  prometheus::Family<prometheus::Gauge>& tasks;  // {state}
  // Ended tasks deleted, {by}: operator (DeleteTask), retention (--keep-ended-tasks).
  prometheus::Family<prometheus::Counter>& tasks_deleted;
  // Tasks whose aggregator work queues the coordinator holds: those it serves, and those deleted
  // or handed over until their last call has returned (AggregatorWorkRunner).
  prometheus::Gauge& task_work_queues;
  prometheus::Family<prometheus::Gauge>& participants;  // {mode}: peers assigned to open tasks
  prometheus::Counter& bytes_received;                  // checkpoints pulled from aggregators
  prometheus::Counter& bytes_sent;  // models served by ControlService.GetModel and restores
  prometheus::Counter& aggregator_errors;
  prometheus::Family<prometheus::Counter>& dial_backs;  // {result}: reachable, unreachable
  prometheus::Counter& peers_relayed;  // unreachable peers moved to a relay (Hello.relay_fallback)
  // Hierarchical tasks now running: their clusters (aggregators below a root), and the deepest
  // level of any of their trees (0: none).
  prometheus::Gauge& tree_clusters;
  prometheus::Gauge& tree_depth;
  // Supernodes elected among the peers (docs/explanation/elections.md).
  prometheus::Family<prometheus::Counter>& supernode_elections;  // {reason}: needed, better
  // {reason}: lost, host_left, timeout, retired
  prometheus::Family<prometheus::Counter>& supernode_ends;
  prometheus::Gauge& supernodes_elected;  // elected peers whose aggregator is registered
  prometheus::Counter& tree_rebuilds;     // trees rebuilt on newly available supernodes
  // Replicas: backups promoted when a cluster's primary was lost, and backups taken on.
  prometheus::Counter& failovers;
  prometheus::Counter& backups_assigned;
  prometheus::Gauge& backups_missing;  // backups the running tasks' clusters lack (no free one)
  // Participants dropped from a secure statistics' masking for not answering a step in time.
  prometheus::Counter& statistics_dropped;
  // The modes' own (services/coordinator/modes/<mode>/):
  FederatedSyncTaskMetrics federated_sync;
  DecentralizedTaskMetrics decentralized;
  GossipTaskMetrics gossip;
};

}  // namespace shoal::coordinator
