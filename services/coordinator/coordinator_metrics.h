#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

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
  prometheus::Gauge& train_loss;                        // mean train loss of the last closed round
  prometheus::Gauge& test_accuracy;                     // test accuracy of the last evaluated model
  prometheus::Family<prometheus::Gauge>& tasks;         // {state}
  prometheus::Family<prometheus::Gauge>& participants;  // {mode}: peers assigned to open tasks
  prometheus::Counter& bytes_received;                  // checkpoints pulled from aggregators
  prometheus::Counter& bytes_sent;  // models served by ControlService.GetModel and restores
  prometheus::Counter& aggregator_errors;
};

}  // namespace shoal::coordinator
