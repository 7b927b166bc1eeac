#include "services/coordinator/modes/gossip/gossip_task_metrics.h"

#include <string>

#include "libs/metrics/builders.h"

namespace shoal::coordinator {

using metrics::Counter;
using metrics::Gauge;

GossipTaskMetrics::GossipTaskMetrics(prometheus::Registry& r)
    : members(Gauge(r, "shoal_coordinator_gossip_members", "Peers in gossip tasks.")),
      membership_updates(Counter(r, "shoal_coordinator_gossip_membership_updates_total",
                                 "GossipMembers events sent (one per peer per change).")),
      progress_reports(Counter(r, "shoal_coordinator_gossip_progress_reports_total",
                               "GossipProgress messages accepted.")),
      peers_done(Counter(r, "shoal_coordinator_gossip_peers_done_total",
                         "Gossip peers that finished their steps.")),
      peer_fetches(Counter(r, "shoal_coordinator_gossip_peer_fetches_total",
                           "Successful gossip fetches reported by peers.")),
      peer_bytes_pulled(Counter(r, "shoal_coordinator_gossip_peer_bytes_pulled_total",
                                "Snapshot bytes gossip peers report having pulled.")),
      slowest_step(Gauge(r, "shoal_coordinator_gossip_slowest_step",
                         "Steps of the slowest member of the last gossip task that reported.")),
      mean_loss(Gauge(r, "shoal_coordinator_gossip_mean_loss",
                      "Mean reported training loss over the members of the last gossip task that "
                      "reported.")) {}

}  // namespace shoal::coordinator
