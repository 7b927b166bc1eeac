#pragma once

// Seams for a test build of the peer: shoal-peer leaves every hook empty, and an empty hook
// changes nothing. The test build (tests/peer_testing/, shoal-peer-testing) fills them to play a
// Byzantine or a slow peer in cluster tests.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "libs/tensor/flat_model.h"

namespace shoal::rpc {
class Wakeup;  // libs/rpc/retry.h
}  // namespace shoal::rpc

namespace shoal::peer {

// What this peer contributes to the others, on its way out; never the copy of the global model
// it keeps for itself. A value type (thread-compatible, copied into every runner's deps).
struct UpdateHooks {
  // Federated-sync and federated-async: the delta pushed to the aggregator (trained model minus
  // the global model it started from), in place (models are large).
  std::function<void(std::vector<float>& delta)> delta;
  // Decentralized: the round update the others fetch (and that every participant, this one
  // included, aggregates), in place; `base` is the model the round started from. An error ends
  // the round's step as a failure.
  std::function<absl::Status(const tensor::FlatModel& base, tensor::FlatModel& model)> model;
  // Decentralized with secure aggregation: called when this peer holds every participant's
  // masked update of `round`, before it tells the coordinator; it may block until keep_going
  // turns false (a peer that fails after masking, before the survivors are fixed).
  std::function<void(uint64_t round, const std::function<bool()>& keep_going)> masked_updates_held;

  void TamperDelta(std::vector<float>& d) const {
    if (delta) delta(d);
  }
  absl::Status TamperModel(const tensor::FlatModel& base, tensor::FlatModel& m) const {
    return model ? model(base, m) : absl::OkStatus();
  }
  void BeforeMaskedUpdatesHeld(uint64_t round, const std::function<bool()>& keep_going) const {
    if (masked_updates_held) masked_updates_held(round, keep_going);
  }
};

// Called after every training batch, in every mode, with the host's wakeup (on the host's clock)
// and the batch's keep_going. It may block, and should return early once keep_going turns false
// (wakeup.SleepFor(delay, keep_going) does both).
using AfterBatchHook =
    std::function<void(const rpc::Wakeup& wakeup, const std::function<bool()>& keep_going)>;

// Every hook of a peer process (PeerOptions, PeerAgentOptions, StaticGossipOptions).
struct PeerHooks {
  UpdateHooks update;
  AfterBatchHook after_batch;
};

// A training::TrainerOptions::after_batch that calls `hook` with `wakeup`; null when `hook` is.
// `wakeup` must outlive every trainer that uses it.
std::function<void(const std::function<bool()>& keep_going)> BindAfterBatch(
    AfterBatchHook hook, const rpc::Wakeup& wakeup);

}  // namespace shoal::peer
