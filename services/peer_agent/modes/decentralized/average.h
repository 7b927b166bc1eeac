#pragma once

// The decentralized round's average: what every participant computes from the same updates.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/tensor/flat_model.h"

namespace shoal::peer {

// One participant's update of a round, as averaged.
struct PeerUpdate {
  std::string peer_id;
  uint64_t num_samples = 0;
  std::shared_ptr<const tensor::FlatModel> model;
};

// The sample-weighted mean of `updates`: sum_j (n_j * x_j) / sum_j n_j per element, accumulated
// in double in ascending peer-id order whatever order `updates` is given in, so every
// participant computes a bit-identical result from the same updates. Errors: INVALID_ARGUMENT
// when there are no updates, a duplicate peer id, a missing model, a layout that differs from
// the first one, or zero total samples (an update with 0 samples counts with weight 0).
absl::StatusOr<tensor::FlatModel> AverageUpdates(std::vector<PeerUpdate> updates);

}  // namespace shoal::peer
