#include "services/peer_agent/peer_metrics.h"

#include "libs/metrics/builders.h"

namespace shoal::peer {

using metrics::Counter;
using metrics::Gauge;

PeerMetrics::PeerMetrics(prometheus::Registry& r)
    : rounds_completed(Counter(r, "shoal_peer_rounds_completed_total",
                               "Rounds whose update this peer pushed successfully.")),
      train_loss(Gauge(r, "shoal_peer_train_loss", "Mean training loss of the last round.")),
      test_accuracy(Gauge(r, "shoal_peer_test_accuracy",
                          "Accuracy of the last global model on this peer's test slice.")),
      bytes_sent(Counter(r, "shoal_peer_bytes_sent_total",
                         "Tensor payload bytes sent (updates, initial models, snapshots).")),
      update_bytes_sent(Counter(r, "shoal_peer_update_bytes_sent_total",
                                "Payload bytes of the updates pushed to an aggregator and "
                                "accepted, or published for a decentralized round, as sent "
                                "(after compression).")),
      update_bytes_raw(Counter(r, "shoal_peer_update_bytes_raw_total",
                               "The same updates' size as float32 (before compression).")),
      bytes_received(Counter(r, "shoal_peer_bytes_received_total",
                             "Tensor payload bytes received (global models).")),
      round_duration(
          prometheus::BuildHistogram()
              .Name("shoal_peer_round_duration_seconds")
              .Help("Time from RoundStarted to the accepted push.")
              .Register(r)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30,
                                                               60, 120, 300})),
      updates_rejected(Counter(r, "shoal_peer_updates_rejected_total",
                               "Pushes the aggregator rejected (closed round, bad update).")),
      samples_trained(Counter(r, "shoal_peer_samples_trained_total", "Samples trained.")),
      connected(Gauge(r, "shoal_peer_connected",
                      "1 while the session stream to the coordinator is up, else 0.")),
      rounds_abandoned(Counter(r, "shoal_peer_rounds_abandoned_total",
                               "Rounds abandoned because a newer event superseded them.")),
      evaluation_wait(Counter(r, "shoal_peer_evaluation_wait_seconds_total",
                              "Seconds a federated-sync peer waited, before taking a published "
                              "model, for the evaluation of the one before to end.")),
      session_reconnects(Counter(r, "shoal_peer_session_reconnects_total",
                                 "Session streams (re)opened after the first.")),
      supernode(Gauge(r, "shoal_peer_supernode",
                      "1 while this peer runs the aggregator of an elected supernode, else 0.")),
      snapshots_served(Counter(r, "shoal_peer_snapshots_served_total",
                               "GetSnapshot streams this peer served (finished or aborted).")),
      snapshots_aborted(Counter(r, "shoal_peer_snapshots_aborted_total",
                                "GetSnapshot streams the reader left before the end.")),
      serve_pacing_rate(Gauge(r, "shoal_peer_serve_pacing_bytes_per_second",
                              "The rate the last GetSnapshot stream served was paced at "
                              "(--serve-pacing; 0: not paced).")),
      peer_bytes_pulled(Counter(r, "shoal_peer_peer_bytes_pulled_total",
                                "Tensor payload bytes fetched from other peers' snapshots.")),
      peer_fetches_failed(Counter(r, "shoal_peer_peer_fetches_failed_total",
                                  "Snapshot fetches from other peers that failed.")),
      snapshots_rejected(Counter(r, "shoal_peer_snapshots_rejected_total",
                                 "Fetched snapshots rejected: wrong layout, non-finite, bad "
                                 "stream.")),
      decentralized(r),
      federated_async(r),
      gossip(r) {}

}  // namespace shoal::peer
