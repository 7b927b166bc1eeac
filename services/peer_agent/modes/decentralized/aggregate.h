#pragma once

// The decentralized round's aggregate: what every participant computes from the same updates.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/aggregation/strategy.h"
#include "libs/tensor/flat_model.h"

namespace shoal::peer {

// One participant's update of a round: the model it trained from the round's base (what it
// publishes as its ROUND_UPDATE snapshot).
struct PeerUpdate {
  std::string peer_id;
  uint64_t num_samples = 0;
  std::shared_ptr<const tensor::FlatModel> model;
};

// An update left out of a round's aggregate, and why.
struct ExcludedUpdate {
  std::string peer_id;
  std::string reason;
};

struct RoundAggregate {
  tensor::FlatModel model;               // base + the strategy's aggregate of the deltas
  std::vector<std::string> included;     // the peers whose updates went in, ascending id
  std::vector<ExcludedUpdate> excluded;  // ascending id
  uint64_t num_samples = 0;              // total samples of the included updates
  std::string note;  // the strategy's AggregationReport::note ("" as configured)
};

// Aggregates a round's updates with the task's `strategy` as deltas (update − base) against the
// round's shared `base` model, folded in ascending peer-id order whatever order `updates` is
// given in: every participant that holds the same base and the same updates (bytes) computes a
// bit-identical model, for the streaming mean as for the order-independent robust strategies.
// An update whose delta's L2 norm exceeds `max_update_norm` (> 0; 0 = no bound), or that was
// trained on 0 samples, is left out (listed in `excluded`); when every update is left out the
// result is `base`. Errors: INVALID_ARGUMENT for no updates, a duplicate peer id, a missing
// model, a layout other than the base's, or a non-finite delta (named by peer, tensor, element).
absl::StatusOr<RoundAggregate> AggregateRound(const aggregation::Strategy& strategy,
                                              const tensor::FlatModel& base,
                                              std::vector<PeerUpdate> updates,
                                              double max_update_norm);

}  // namespace shoal::peer
