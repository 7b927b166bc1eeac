#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/aggregation/strategy.h"
#include "libs/tensor/flat_model.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/round_aggregation.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::aggregator {

// Why a push was turned away: the status for the caller and the reason for the metrics.
struct PushRefusal {
  RejectReason reason;
  absl::Status status;
};

// What AggregatorService.OpenBuffer asks for.
struct BufferSettings {
  common::v1::AsyncSpec async;
  v1::AggregationSettings aggregation;
  double max_update_norm = 0;  // 0 = no bound
  uint64_t last_version = 0;   // publish no version after this one (0 = no limit)
  // A tree's node below the root: its full buffers go to this parent (address set), which it
  // takes its versions from. And the child nodes whose aggregates enter this buffer.
  v1::ParentRound parent = {};
  std::set<std::string> children = {};
  bool forwards() const { return !parent.address().empty(); }
};

// The federated-async buffer of one task (AggregatorService.OpenBuffer): its settings, the
// updates waiting to be aggregated (at most one per peer, at most async.buffer_size of them) and
// the bookkeeping of the pass that aggregates a full buffer into the next version. Rules and
// data only: the owner (AggregatorCore, one per task) locks around every call, publishes the
// versions and sends the events; RunPass, the pass over the model, works on updates the caller
// took out of the buffer and needs no lock. Not thread-safe.
//
// Memory: the buffer holds up to K = buffer_size updates. While a pass runs, its updates count
// against K until they are folded into the running sum (mean) or until the pass ends (the other
// strategies copy them), so buffer and pass together never hold more than K updates; an update
// from a new peer that finds no room is refused with RESOURCE_EXHAUSTED (retry).
class UpdateBuffer {
 public:
  // One buffered update.
  struct Update {
    std::string peer;
    uint64_t base_version = 0;
    uint64_t staleness = 0;  // versions behind the latest when it arrived
    uint64_t num_samples = 0;
    double train_loss = 0;
    // Of the delta's values. With the fields above it tells a retried push (same values) from
    // a new update of the same peer and base version (which replaces the older one).
    double sum_squares = 0;
    std::vector<float> delta;
    // A child node's aggregate (`peer` is the child's id): the peers it holds. Empty for a
    // peer's own update.
    std::vector<std::string> contributors = {};
    bool merged = false;  // two aggregates in one, each scaled by its staleness already
  };

  // Whether an update may enter, and its staleness.
  struct Admission {
    uint64_t staleness = 0;
    std::optional<PushRefusal> refusal;  // set: it may not
  };

  // What a pass aggregated.
  struct PassResult {
    aggregation::AggregationReport report;
    std::vector<std::string> contributors;  // sorted: peers (a child's aggregate adds its own)
    uint64_t num_samples = 0;
    double mean_train_loss = 0;  // sample-weighted
    double mean_staleness = 0;   // unweighted, in versions
  };

  // Checks `settings`, applies the AsyncSpec defaults (async.buffer_size is required: the
  // aggregator does not know min_participants) and makes the strategy. Errors: INVALID_ARGUMENT
  // naming the field, e.g. "async.buffer_size: required (>= 1)". `task` is for messages;
  // `threads` split the passes over the model.
  static absl::StatusOr<std::unique_ptr<UpdateBuffer>> Create(std::string task,
                                                              BufferSettings settings,
                                                              uint64_t opened_on, int threads);
  // An empty buffer with the same settings, opened on `version` (after a restore).
  std::unique_ptr<UpdateBuffer> Reopen(uint64_t version) const;

  // How much of the capacity an update fills: a child node's aggregate as many as the peers'
  // updates it holds, a peer's update one.
  static size_t Weight(const Update& update) {
    return update.contributors.empty() ? 1 : update.contributors.size();
  }

  // The settings with defaults applied.
  const BufferSettings& settings() const { return settings_; }
  const aggregation::Strategy& strategy() const { return strategy_; }
  // The version the buffer was opened (or last reset) on.
  uint64_t opened_on() const { return opened_on_; }
  size_t capacity() const { return settings_.async.buffer_size(); }
  // Updates waiting in the buffer (not those of a running pass). The buffer is full when their
  // Weight()s add up to capacity().
  size_t size() const { return updates_.size(); }
  // True when `other` has the same settings (after defaults), but for async.buffer_size and
  // the children (a tree's peers changed: Adjust).
  bool SameSettings(const UpdateBuffer& other) const;
  // Takes `other`'s buffer_size and children, keeping the updates (a smaller size makes the
  // buffer full at its next update).
  void Adjust(const UpdateBuffer& other);
  // True once `latest` is the last version (BufferSettings.last_version).
  bool Finished(uint64_t latest) const;

  // May an update of `peer`, trained from `base_version`, enter while `latest` is the newest
  // version? Refusals: the last version published or being aggregated, a base newer than
  // `latest`, staleness above async.max_staleness, no room while a pass runs.
  Admission Admit(const std::string& peer, uint64_t base_version, uint64_t latest) const;
  // True when `update` repeats the peer's update in the buffer or in the last pass (a retried
  // push): the caller ignores it.
  bool Repeats(const Update& update) const;
  // Puts an admitted update into the buffer; returns the peer's older update it replaced.
  std::optional<Update> Put(Update update);
  // A child node's aggregate when the buffer holds one of that child already: the two are
  // merged into one (each scaled by its staleness weight, then their sample-weighted mean), as
  // they hold different peers' updates. False (nothing done) otherwise.
  bool Merge(const Update& update);

  // Peers with a push streaming into this buffer (one at a time per peer).
  std::set<std::string>& pushing() { return pushing_; }
  // Peers whose updates wait in the buffer or in the running pass, sorted.
  std::vector<std::string> Pending() const;

  // Passes. At most one runs at a time: ClaimPass() says whether the caller must run one (the
  // buffer is full and none runs); the runner then loops on TakeFullPass() (nullopt ends its
  // turn), running each with RunPass and calling Folded() per update folded into a streaming
  // sum, then PassDone().
  bool ClaimPass();
  std::optional<std::vector<Update>> TakeFullPass();
  void Folded();
  void PassDone();
  bool pass_running() const { return pass_running_; }

  // The aggregation a pass folds into: the kept one when it fits (mean keeps its running sum
  // from pass to pass), else a new one. Hand it back with KeepAggregation.
  std::unique_ptr<RoundAggregation> TakeAggregation(const tensor::ModelLayout& layout);
  void KeepAggregation(std::unique_ptr<RoundAggregation> aggregation);

  // Aggregates `updates` (sorted by peer) into base + aggregate, written to `out`. Each delta is
  // first scaled by StalenessWeight(async, staleness) (in place), then mean weighs the updates by
  // num_samples; the other strategies ignore weights. `folded(update)` is called once each update
  // is in `aggregation`; its delta may be taken then. Errors (INVALID_ARGUMENT) mean a broken
  // invariant. No lock needed.
  static absl::StatusOr<PassResult> RunPass(std::vector<Update>& updates,
                                            RoundAggregation& aggregation,
                                            const common::v1::AsyncSpec& async,
                                            const tensor::FlatModel& base, std::vector<float>& out,
                                            const std::function<void(Update&)>& folded);

 private:
  struct Fingerprint {
    uint64_t base_version = 0;
    uint64_t num_samples = 0;
    double train_loss = 0;
    double sum_squares = 0;
    bool operator==(const Fingerprint&) const = default;
  };
  static Fingerprint FingerprintOf(const Update& update);

  UpdateBuffer(std::string task, BufferSettings settings, aggregation::Strategy strategy,
               uint64_t opened_on, int threads);

  const std::string task_;  // escaped, for messages
  BufferSettings settings_;
  const aggregation::Strategy strategy_;
  const uint64_t opened_on_;
  const int threads_;
  std::map<std::string, Update> updates_;  // by peer
  size_t filled_ = 0;                      // their Weight()s
  std::set<std::string> pushing_;
  // The last pass's updates, so that a retried push of one of them is not aggregated twice.
  std::map<std::string, Fingerprint> last_pass_;
  // Children's aggregates merged into the one waiting in the buffer (so that a retried one is
  // not merged twice).
  std::multimap<std::string, Fingerprint> merged_;
  bool pass_running_ = false;
  size_t pass_held_ = 0;  // updates of the running pass still counted against the capacity
  std::set<std::string> pass_peers_;
  std::unique_ptr<RoundAggregation> aggregation_;
};

}  // namespace shoal::aggregator
