#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "libs/tensor/flat_model.h"

namespace shoal::peer {

// One participant's update of a round: the model it trained from the round's base (what it
// publishes as its ROUND_UPDATE snapshot), or with `delta` that model minus the base (a task with
// compression exchanges the deltas, compressed, and folds them as decoded).
struct PeerUpdate {
  std::string peer_id;
  uint64_t num_samples = 0;
  std::shared_ptr<const tensor::FlatModel> model;
  bool delta = false;
};

}  // namespace shoal::peer
