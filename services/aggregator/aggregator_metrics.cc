#include "services/aggregator/aggregator_metrics.h"

namespace shoal::aggregator {

const char* RejectReasonLabel(RejectReason reason) {
  switch (reason) {
    case RejectReason::kUnknownTask:
      return "unknown_task";
    case RejectReason::kRoundNotOpen:
      return "round_not_open";
    case RejectReason::kUnexpectedPeer:
      return "unexpected_peer";
    case RejectReason::kStaleBase:
      return "stale_base";
    case RejectReason::kMalformed:
      return "malformed";
    case RejectReason::kNonFinite:
      return "non_finite";
    case RejectReason::kNormBound:
      return "norm_bound";
    case RejectReason::kBusy:
      return "busy";
    case RejectReason::kIncomplete:
      return "incomplete";
    case RejectReason::kUnauthenticated:
      return "unauthenticated";
    case RejectReason::kStale:
      return "stale";
    case RejectReason::kStandby:
      return "standby";
  }
  return "unknown";
}

AggregatorMetrics::AggregatorMetrics(prometheus::Registry& registry)
    : updates_accepted(prometheus::BuildCounter()
                           .Name("shoal_aggregator_updates_accepted_total")
                           .Help("Updates validated and folded into a round's aggregate")
                           .Register(registry)
                           .Add({})),
      rejected_family(prometheus::BuildCounter()
                          .Name("shoal_aggregator_updates_rejected_total")
                          .Help("Pushed updates rejected, by reason; never averaged in")
                          .Register(registry)),
      bytes_received(prometheus::BuildCounter()
                         .Name("shoal_aggregator_bytes_received_total")
                         .Help("Bytes of model and update streams received")
                         .Register(registry)
                         .Add({})),
      bytes_sent(prometheus::BuildCounter()
                     .Name("shoal_aggregator_bytes_sent_total")
                     .Help("Bytes of model streams sent")
                     .Register(registry)
                     .Add({})),
      download_encodes(prometheus::BuildCounter()
                           .Name("shoal_aggregator_download_encodes_total")
                           .Help("Models encoded against a version peers hold (XOR_SPARSE_ZLIB)")
                           .Register(registry)
                           .Add({})),
      download_encode_seconds(prometheus::BuildCounter()
                                  .Name("shoal_aggregator_download_encode_seconds_total")
                                  .Help("Time spent encoding models against a held version")
                                  .Register(registry)
                                  .Add({})),
      rounds_completed(prometheus::BuildCounter()
                           .Name("shoal_aggregator_rounds_completed_total")
                           .Help("Rounds closed (with or without contributors)")
                           .Register(registry)
                           .Add({})),
      round_duration(
          prometheus::BuildHistogram()
              .Name("shoal_aggregator_round_duration_seconds")
              .Help("Time from OpenRound to CloseRound")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                                                               60, 120, 300, 600})),
      pushes_in_flight(prometheus::BuildGauge()
                           .Name("shoal_aggregator_pushes_in_flight")
                           .Help("Update pushes holding a staging buffer")
                           .Register(registry)
                           .Add({})),
      model_version(prometheus::BuildGauge()
                        .Name("shoal_aggregator_model_version")
                        .Help("Latest global model version published or stored")
                        .Register(registry)
                        .Add({})),
      tasks_held(prometheus::BuildGauge()
                     .Name("shoal_aggregator_tasks")
                     .Help("Tasks held (models, a round or buffer), until their coordinator "
                           "releases them")
                     .Register(registry)
                     .Add({})),
      update_staleness(
          prometheus::BuildHistogram()
              .Name("shoal_aggregator_update_staleness_versions")
              .Help("Staleness of the updates accepted into federated-async buffers: "
                    "the latest version minus the version trained from")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16, 32})),
      versions_published(prometheus::BuildCounter()
                             .Name("shoal_aggregator_versions_published_total")
                             .Help("Model versions published by federated-async buffers")
                             .Register(registry)
                             .Add({})),
      buffered_updates(prometheus::BuildGauge()
                           .Name("shoal_aggregator_buffered_updates")
                           .Help("Updates waiting in federated-async buffers, over all tasks")
                           .Register(registry)
                           .Add({})),
      max_buffer_refusals(prometheus::BuildCounter()
                              .Name("shoal_aggregator_max_buffer_refusals_total")
                              .Help("OpenRound and OpenBuffer calls refused because the round or "
                                    "buffer would hold more than --max-buffer-bytes")
                              .Register(registry)
                              .Add({})),
      partials_accepted(prometheus::BuildCounter()
                            .Name("shoal_aggregator_partials_accepted_total")
                            .Help("Child aggregators' partial sums (and federated-async "
                                  "aggregates) added to this one's rounds (buffer)")
                            .Register(registry)
                            .Add({})),
      partials_forwarded(prometheus::BuildCounter()
                             .Name("shoal_aggregator_partials_forwarded_total")
                             .Help("Partial sums of child rounds, and aggregates of full "
                                   "federated-async buffers, sent to the parent aggregator")
                             .Register(registry)
                             .Add({})),
      partials_lost(prometheus::BuildCounter()
                        .Name("shoal_aggregator_partials_lost_total")
                        .Help("Aggregates of full federated-async buffers that the parent "
                              "aggregator did not take (their updates are lost)")
                        .Register(registry)
                        .Add({})),
      replications_family(prometheus::BuildCounter()
                              .Name("shoal_aggregator_replications_total")
                              .Help("Accepted updates copied to a backup of the cluster before "
                                    "the peer was answered, by result (copied, failed)")
                              .Register(registry)),
      replications_copied(replications_family.Add({{"result", "copied"}})),
      replications_failed(replications_family.Add({{"result", "failed"}})),
      secure_restarts(prometheus::BuildCounter()
                          .Name("shoal_aggregator_secure_restarts_total")
                          .Help("Secure rounds started again from their first step on this "
                                "aggregator, a backup that took over a lost primary's cluster")
                          .Register(registry)
                          .Add({})),
      relay_streams(prometheus::BuildGauge()
                        .Name("shoal_aggregator_relay_streams")
                        .Help("Peers behind NAT keeping a Relay stream open to this aggregator")
                        .Register(registry)
                        .Add({})),
      relay_calls_family(prometheus::BuildCounter()
                             .Name("shoal_aggregator_relay_calls_total")
                             .Help("PeerService calls relayed to peers behind NAT, by result "
                                   "(relayed, no_stream, failed)")
                             .Register(registry)),
      relay_calls_relayed(relay_calls_family.Add({{"result", "relayed"}})),
      relay_calls_no_stream(relay_calls_family.Add({{"result", "no_stream"}})),
      relay_calls_failed(relay_calls_family.Add({{"result", "failed"}})),
      relay_bytes(prometheus::BuildCounter()
                      .Name("shoal_aggregator_relay_bytes_total")
                      .Help("Snapshot bytes relayed from peers behind NAT to their callers")
                      .Register(registry)
                      .Add({})) {
  for (int i = 0; i < kNumRejectReasons; ++i) {
    rejected[i] =
        &rejected_family.Add({{"reason", RejectReasonLabel(static_cast<RejectReason>(i))}});
  }
}

}  // namespace shoal::aggregator
