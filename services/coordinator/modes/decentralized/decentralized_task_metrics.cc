#include "services/coordinator/modes/decentralized/decentralized_task_metrics.h"

namespace shoal::coordinator {

DecentralizedTaskMetrics::DecentralizedTaskMetrics(prometheus::Registry& registry)
    : joins(prometheus::BuildCounter()
                .Name("shoal_coordinator_decentralized_joins_total")
                .Help("Peers that joined a decentralized round")
                .Register(registry)
                .Add({})),
      leaves(prometheus::BuildCounter()
                 .Name("shoal_coordinator_decentralized_leaves_total")
                 .Help("Round members that left or crashed during a round")
                 .Register(registry)
                 .Add({})),
      connection_retries(prometheus::BuildCounter()
                             .Name("shoal_coordinator_decentralized_connection_retries_total")
                             .Help("Peer lists sent again because participants could not connect")
                             .Register(registry)
                             .Add({})),
      removed_peers(prometheus::BuildCounter()
                        .Name("shoal_coordinator_decentralized_removed_peers_total")
                        .Help("Peers removed from a round (connection failed, timed out)")
                        .Register(registry)
                        .Add({})),
      sync_transfers(prometheus::BuildCounter()
                         .Name("shoal_coordinator_decentralized_sync_transfers_total")
                         .Help("Model syncs of joining peers that succeeded")
                         .Register(registry)
                         .Add({})),
      sync_failures(prometheus::BuildCounter()
                        .Name("shoal_coordinator_decentralized_sync_failures_total")
                        .Help("Model syncs that failed or timed out (retried)")
                        .Register(registry)
                        .Add({})),
      digest_mismatches(prometheus::BuildCounter()
                            .Name("shoal_coordinator_decentralized_digest_mismatches_total")
                            .Help("Rounds whose participants reported different averaged models")
                            .Register(registry)
                            .Add({})),
      sync_duration(prometheus::BuildHistogram()
                        .Name("shoal_coordinator_decentralized_sync_duration_seconds")
                        .Help("Duration of successful model syncs")
                        .Register(registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{0.05, 0.1, 0.25, 0.5, 1, 2,
                                                                         5, 10, 30, 60})),
      round_participants(prometheus::BuildGauge()
                             .Name("shoal_coordinator_decentralized_round_participants")
                             .Help("Participants of the last completed decentralized round")
                             .Register(registry)
                             .Add({})),
      round_overhead(
          prometheus::BuildHistogram()
              .Name("shoal_coordinator_decentralized_round_overhead_seconds")
              .Help("Time from a round's first ready to its last participant holding the average")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                               2, 5, 10, 30})) {}

}  // namespace shoal::coordinator
