#include "services/coordinator/coordinator_metrics.h"

namespace shoal::coordinator {

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : rounds_completed(prometheus::BuildCounter()
                           .Name("shoal_coordinator_rounds_completed_total")
                           .Help("Rounds closed by the coordinator, all tasks")
                           .Register(registry)
                           .Add({})),
      round_duration(prometheus::BuildHistogram()
                         .Name("shoal_coordinator_round_duration_seconds")
                         .Help("Time from a round's start to its close")
                         .Register(registry)
                         .Add({}, prometheus::Histogram::BucketBoundaries{0.5, 1, 2, 5, 10, 20, 30,
                                                                          60, 120, 300, 600})),
      peers_connected(prometheus::BuildGauge()
                          .Name("shoal_coordinator_peers_connected")
                          .Help("Peers with an open Session stream")
                          .Register(registry)
                          .Add({})),
      aggregators_registered(prometheus::BuildGauge()
                                 .Name("shoal_coordinator_aggregators_registered")
                                 .Help("Aggregators that registered within their TTL")
                                 .Register(registry)
                                 .Add({})),
      updates_accepted(prometheus::BuildCounter()
                           .Name("shoal_coordinator_updates_accepted_total")
                           .Help("Peer updates reported pushed in time for their round")
                           .Register(registry)
                           .Add({})),
      messages_rejected(prometheus::BuildCounter()
                            .Name("shoal_coordinator_messages_rejected_total")
                            .Help("Peer messages ignored as invalid or stale, by reason")
                            .Register(registry)),
      peers_dropped(prometheus::BuildCounter()
                        .Name("shoal_coordinator_peers_dropped_total")
                        .Help("Expected peers that missed a round's close")
                        .Register(registry)
                        .Add({})),
      peers_crashed(prometheus::BuildCounter()
                        .Name("shoal_coordinator_peers_crashed_total")
                        .Help("Peers lost without a Leave (stream broken or heartbeats missed)")
                        .Register(registry)
                        .Add({})),
      peers_silent_held(prometheus::BuildGauge()
                            .Name("shoal_coordinator_peers_silent_held")
                            .Help("Peers past the heartbeat limit that are not declared crashed "
                                  "because most peers went silent at once (a reconnect storm "
                                  "the coordinator is behind on, or a split network)")
                            .Register(registry)
                            .Add({})),
      train_loss(prometheus::BuildGauge()
                     .Name("shoal_coordinator_train_loss")
                     .Help("Mean train loss of the last closed round")
                     .Register(registry)
                     .Add({})),
      test_accuracy(prometheus::BuildGauge()
                        .Name("shoal_coordinator_test_accuracy_ratio")
                        .Help("Test accuracy of the last evaluated global model")
                        .Register(registry)
                        .Add({})),
      privacy_epsilon(prometheus::BuildGauge()
                          .Name("shoal_coordinator_privacy_epsilon")
                          .Help("Differential privacy: epsilon spent, at the task's delta, by the "
                                "task of the last round charged to a privacy budget")
                          .Register(registry)
                          .Add({})),
      privacy_rounds(prometheus::BuildCounter()
                         .Name("shoal_coordinator_privacy_rounds_total")
                         .Help("Rounds charged to a task's differential privacy budget")
                         .Register(registry)
                         .Add({})),
      tasks(prometheus::BuildGauge()
                .Name("shoal_coordinator_tasks")
                .Help("Tasks by state")
                .Register(registry)),
      tasks_deleted(prometheus::BuildCounter()
                        .Name("shoal_coordinator_tasks_deleted_total")
                        .Help("Ended tasks deleted with their rounds and checkpoints, by who "
                              "deleted them (operator: DeleteTask; retention: "
                              "--keep-ended-tasks)")
                        .Register(registry)),
      task_work_queues(prometheus::BuildGauge()
                           .Name("shoal_coordinator_task_work_queues")
                           .Help("Tasks whose aggregator work queues the coordinator holds: those "
                                 "it serves, and those deleted or handed over until their last "
                                 "call returned")
                           .Register(registry)
                           .Add({})),
      participants(prometheus::BuildGauge()
                       .Name("shoal_coordinator_participants")
                       .Help("Peers assigned to open tasks, by the tasks' training mode")
                       .Register(registry)),
      bytes_received(prometheus::BuildCounter()
                         .Name("shoal_coordinator_bytes_received_total")
                         .Help("Model bytes pulled from aggregators for checkpoints")
                         .Register(registry)
                         .Add({})),
      bytes_sent(prometheus::BuildCounter()
                     .Name("shoal_coordinator_bytes_sent_total")
                     .Help("Model bytes sent (GetModel downloads and checkpoint restores)")
                     .Register(registry)
                     .Add({})),
      aggregator_errors(prometheus::BuildCounter()
                            .Name("shoal_coordinator_aggregator_errors_total")
                            .Help("Failed calls to aggregators")
                            .Register(registry)
                            .Add({})),
      dial_backs(prometheus::BuildCounter()
                     .Name("shoal_coordinator_dial_backs_total")
                     .Help("Dials of peers' and aggregators' advertised addresses, by result "
                           "(reachable, unreachable)")
                     .Register(registry)),
      peers_relayed(prometheus::BuildCounter()
                        .Name("shoal_coordinator_peers_relayed_total")
                        .Help("Peers the coordinator could not reach that it moved to a relay "
                              "(they said Hello.relay_fallback)")
                        .Register(registry)
                        .Add({})),
      tree_clusters(prometheus::BuildGauge()
                        .Name("shoal_coordinator_tree_clusters")
                        .Help("Clusters (aggregators below a root) of the hierarchical tasks now "
                              "running")
                        .Register(registry)
                        .Add({})),
      tree_depth(prometheus::BuildGauge()
                     .Name("shoal_coordinator_tree_depth")
                     .Help("Deepest level of the trees of the hierarchical tasks now running "
                           "(0: none; 1: a root and its children)")
                     .Register(registry)
                     .Add({})),
      supernode_elections(prometheus::BuildCounter()
                              .Name("shoal_coordinator_supernode_elections_total")
                              .Help("Peers elected supernode, by reason (needed: the tasks "
                                    "needed more aggregators; better: a clearly better node)")
                              .Register(registry)),
      supernode_ends(prometheus::BuildCounter()
                         .Name("shoal_coordinator_supernode_ends_total")
                         .Help("Elected supernodes that ended, by reason (lost: its aggregator "
                               "was lost; host_left: its peer left before it registered; "
                               "timeout: it never registered; retired: unused)")
                         .Register(registry)),
      supernodes_elected(prometheus::BuildGauge()
                             .Name("shoal_coordinator_supernodes_elected")
                             .Help("Elected peers whose aggregator is registered")
                             .Register(registry)
                             .Add({})),
      tree_rebuilds(prometheus::BuildCounter()
                        .Name("shoal_coordinator_tree_rebuilds_total")
                        .Help("Trees of hierarchical tasks rebuilt to take in newly available "
                              "aggregators (over-full clusters, or a clearly better node)")
                        .Register(registry)
                        .Add({})),
      failovers(prometheus::BuildCounter()
                    .Name("shoal_coordinator_failovers_total")
                    .Help("Backups promoted to primary of their cluster when the primary "
                          "aggregator was lost (the round went on)")
                    .Register(registry)
                    .Add({})),
      backups_assigned(prometheus::BuildCounter()
                           .Name("shoal_coordinator_backups_assigned_total")
                           .Help("Aggregators taken on as a cluster's backup (replicas)")
                           .Register(registry)
                           .Add({})),
      backups_missing(prometheus::BuildGauge()
                          .Name("shoal_coordinator_backups_missing")
                          .Help("Backups the clusters of running hierarchical tasks lack "
                                "(replicas - 1 each): no free aggregator to take on")
                          .Register(registry)
                          .Add({})),
      statistics_dropped(prometheus::BuildCounter()
                             .Name("shoal_coordinator_statistics_dropped_total")
                             .Help("Participants dropped from a masking of the federation's "
                                   "secure statistics for not answering a step within its "
                                   "deadline (the others masked again)")
                             .Register(registry)
                             .Add({})),
      federated_sync(registry),
      decentralized(registry),
      gossip(registry) {}

}  // namespace shoal::coordinator
