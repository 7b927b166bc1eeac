#include "services/peer_agent/modes/decentralized/decentralized_metrics.h"

#include "libs/metrics/builders.h"

namespace shoal::peer {

using metrics::Counter;

DecentralizedPeerMetrics::DecentralizedPeerMetrics(prometheus::Registry& r)
    : rounds_joined(Counter(r, "shoal_peer_decentralized_rounds_joined_total",
                            "Decentralized rounds this peer joined.")),
      rounds_refused(Counter(r, "shoal_peer_decentralized_rounds_refused_total",
                             "Decentralized rounds this peer was refused or removed from.")),
      probes_failed(Counter(r, "shoal_peer_decentralized_probes_failed_total",
                            "Probes of other participants that failed.")),
      sync_transfers(Counter(r, "shoal_peer_decentralized_sync_transfers_total",
                             "Model syncs (GLOBAL snapshot loaded from a provider).")),
      sync_failures(
          Counter(r, "shoal_peer_decentralized_sync_failures_total", "Model syncs that failed.")),
      sharing_duration(
          prometheus::BuildHistogram()
              .Name("shoal_peer_decentralized_sharing_duration_seconds")
              .Help("Time from StartSharing to holding the averaged model.")
              .Register(r)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                               2, 5, 10, 30})),
      updates_excluded(Counter(r, "shoal_peer_decentralized_updates_excluded_total",
                               "Round updates left out of this peer's aggregate: delta norm "
                               "over max_update_norm, or trained on 0 samples.")),
      updates_spilled(Counter(r, "shoal_peer_decentralized_updates_spilled_total",
                              "Round updates that waited for their turn in the fold on disk "
                              "(the float mean of a large model).")) {}

}  // namespace shoal::peer
