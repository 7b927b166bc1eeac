#pragma once

#include "shoal/common/v1/capacity.pb.h"

namespace shoal::coordinator {

// How the coordinator ranks nodes to aggregate on (supernode elections, the pool's pick for a
// new cluster, the replacement of a cluster's aggregator; docs/explanation/elections.md): the
// well connected first, then by compute. An aggregator sends each version to the peers it
// serves and takes their updates, so a slow uplink holds up every round it serves, however
// much compute is behind it.

// Cores x the matrix-multiply score (0 when not reported).
double Compute(const common::v1::Capacity& c);

// A node is well connected with an upload of at least this share of the best one's among
// those ranked.
inline constexpr double kWellConnected = 0.5;

// Whether `c` is well connected next to the best upload among those ranked (every node is when
// none measured its upload, `best_upload` 0; one that did not measure its own is not when
// another did).
bool WellConnected(const common::v1::Capacity& c, double best_upload);

// Whether a free node (`candidate`) should replace a cluster's aggregator (`serving`): with at
// least `factor` times its upload, or with at least `factor` times its compute and an upload
// not under kWellConnected of its (an upload either did not measure is not compared).
bool ClearlyBetter(const common::v1::Capacity& candidate, const common::v1::Capacity& serving,
                   double factor);

}  // namespace shoal::coordinator
