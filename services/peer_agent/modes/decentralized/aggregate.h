#pragma once

// The decentralized round's aggregate: what every participant computes from the same updates.

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/aggregation/strategy.h"
#include "libs/tensor/flat_model.h"
#include "services/peer_agent/modes/decentralized/peer_update.h"
#include "services/peer_agent/modes/decentralized/waiting_updates.h"

namespace shoal::peer {

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

// A round's aggregate folded as its updates arrive, for a fixed set of participants, the same as
// folding them all in ascending id order (AggregateRound, bit for bit) whatever order they
// arrive in. With a strategy whose result depends on the order (mean with float sums) an update
// goes into the strategy as soon as every participant with a lower id is in: one that arrives
// before a lower id's waits (WaitingUpdates: in memory up to `waiting.memory_bytes`, on disk
// beyond), so a caller may fetch in any order. With an order-independent strategy (any_order())
// each update goes in as it arrives and nothing waits. Not thread-safe. The round's base model
// is passed to each call: the same model every time.
class RoundFold {
 public:
  // `participants`: the peer ids whose updates make the round (any order). Errors:
  // INVALID_ARGUMENT no participants, or a duplicate id.
  static absl::StatusOr<RoundFold> Start(const aggregation::Strategy& strategy,
                                         const tensor::ModelLayout& layout,
                                         std::vector<std::string> participants,
                                         double max_update_norm, WaitingOptions waiting = {});

  // Starts again for the next round's `participants` (as Start) over the same strategy and
  // layout, keeping the model-sized buffers (the strategy's sums, the delta): a fresh one costs
  // the first touch of each of its pages, the kernel zeroing them, in every round. Errors as
  // Start's, the fold then unchanged.
  absl::Status Restart(std::vector<std::string> participants);

  // Ascending.
  const std::vector<std::string>& participants() const { return ids_; }
  // Updates fold in any order (aggregation::Strategy::order_independent): a caller may fetch
  // them in any order without holding any.
  bool any_order() const { return any_order_; }
  const tensor::ModelLayout& layout() const { return aggregation_->layout(); }
  // Offered already (folded or waiting).
  bool Has(const std::string& peer_id) const;
  // Every participant's update is folded.
  bool complete() const { return (any_order_ ? folded_.size() : next_) == ids_.size(); }
  // Updates held while they wait for a lower id's.
  size_t waiting() const { return waiting_.size(); }
  // Updates that waited on disk in this round (WaitingOptions::memory_bytes).
  size_t spilled() const { return waiting_.spilled(); }
  // WaitingOptions::memory_bytes for the updates offered from now on.
  void set_waiting_memory_bytes(size_t bytes) { waiting_.set_memory_bytes(bytes); }
  // Lets go of the updates still waiting (their memory, their files): a fold that will not
  // complete, kept only for its buffers (Restart).
  void DropWaiting() { waiting_.Clear(); }

  // Takes `update`, folding it (and whatever waited for it) when its turn has come. Errors,
  // INVALID_ARGUMENT naming the peer: not a participant, offered before, no model, a layout
  // other than `base`'s, or a non-finite delta (of this update, or of one that waited for it:
  // the round then cannot complete); WaitingUpdates' errors of writing or reading an update
  // that waits on disk (the round then cannot complete either).
  absl::Status Offer(PeerUpdate update, const tensor::FlatModel& base);
  // base + the strategy's aggregate, written into `buffer`'s storage (pass a recycled model-sized
  // buffer, as Aggregation::ApplyInto). Errors: FAILED_PRECONDITION when not complete();
  // INVALID_ARGUMENT as Aggregation::ApplyInto.
  absl::StatusOr<RoundAggregate> Finish(const tensor::FlatModel& base,
                                        std::vector<float> buffer = {});

 private:
  RoundFold(std::unique_ptr<aggregation::Aggregation> aggregation, std::vector<std::string> ids,
            double max_update_norm, bool any_order, WaitingOptions waiting);
  absl::Status Fold(const PeerUpdate& update, const tensor::FlatModel& base);

  std::unique_ptr<aggregation::Aggregation> aggregation_;
  std::vector<std::string> ids_;  // ascending
  double max_update_norm_ = 0;
  bool any_order_ = false;
  size_t next_ = 0;               // in order: ids_[next_] is the next to fold
  std::set<std::string> folded_;  // in any order: the ids folded
  WaitingUpdates waiting_;        // offered before their turn
  RoundAggregate out_;            // included, excluded, num_samples so far
  std::vector<float> delta_;      // scratch
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
