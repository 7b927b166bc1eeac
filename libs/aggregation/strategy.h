#pragma once

// Aggregation strategies: how the updates of a round (deltas from the round's common base
// model) become the next model. One seam for the aggregator service and the decentralized peer
// runner: a task's `aggregation` + `aggregation_options` make a Strategy (MakeStrategy); each
// round starts an Aggregation from it, Adds the updates and writes base + aggregate.
//
// Strategies (protos/shoal/common/v1/task.proto, docs/explanation/aggregation.md):
//   mean               streaming, sample-weighted (FedAvg; WeightedMeanAccumulator); with
//                      exact_sum, order-independent to the bit
//   median             coordinate-wise median
//   trimmed-mean       coordinate-wise mean without floor(trim_ratio K) extremes at each end
//   krum, multi-krum   Blanchard et al. 2017
//   centered-clipping  Karimireddy et al. 2021
// All but mean are unweighted (a Byzantine peer can lie about its sample count) and hold every
// update of the round: K x the model's bytes.
//
// Determinism: the non-streaming strategies sort the updates by contributor id before
// computing, so the result is bit-identical whatever the order of the Adds (and whatever the
// number of threads). Mean folds in arrival order, and float sums depend on it: callers that
// need bit-identical models fold in a fixed order, or set exact_sum.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/aggregation/weighted_mean.h"
#include "libs/tensor/flat_model.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::aggregation {

// What a round's aggregation reports besides the model.
struct AggregationReport {
  size_t updates = 0;  // updates that went in
  // Empty when the strategy ran as configured. Otherwise why and how it ran differently, for the
  // caller to log and count, e.g. "krum: 4 updates fit byzantine_peers 0, not the configured 1
  // (krum needs 2f+3 updates)", or "no updates: the result is the base model".
  std::string note;
  // krum, multi-krum: the contributors whose updates make the result, in id order. Empty for
  // the other strategies (every update counts).
  std::vector<std::string> selected;
};

// One round's aggregation: Add every update, then ApplyInto. Made by Strategy::Start; owned by
// the round; not thread-safe (one caller at a time; the passes themselves may use the
// strategy's threads).
class Aggregation {
 public:
  virtual ~Aggregation() = default;
  Aggregation(const Aggregation&) = delete;
  Aggregation& operator=(const Aggregation&) = delete;

  // Adds one contributor's update: `delta` (layout().total_elements() floats, relative to the
  // round's base model) with `weight` > 0 (samples trained; only mean uses it). The non-streaming
  // strategies copy `delta`. Errors, INVALID_ARGUMENT, nothing added: a size mismatch, a
  // non-finite value (named by tensor and element), a non-positive or non-finite weight, a
  // contributor already added to this round (the caller decides which of two pushes counts).
  // `finite`: the caller knows every value of `delta` is finite (e.g. its L2 norm, summed in
  // double, is), and the pass that looks for one that is not is skipped.
  absl::Status Add(absl::Span<const float> delta, double weight, absl::string_view contributor,
                   bool finite = false);

  // Writes base + aggregate(deltas) into `out` (resized; its capacity is reused, so pass a
  // recycled model buffer to skip the first-touch cost of a fresh one). `out` must not be
  // base.values. With no updates the result is `base`. Errors: INVALID_ARGUMENT when `base`
  // does not have layout(). A round may ApplyInto more than once.
  absl::StatusOr<AggregationReport> ApplyInto(const tensor::FlatModel& base,
                                              std::vector<float>& out) const;

  size_t count() const { return contributors_.size(); }
  double total_weight() const { return total_weight_; }
  const tensor::ModelLayout& layout() const { return layout_; }
  // Forgets every update, keeping the buffers for the next round of the same layout.
  void Reset();

 protected:
  Aggregation(tensor::ModelLayout layout, int threads);
  int threads() const { return threads_; }

  // The strategy's part of Add, after the checks above passed.
  virtual absl::Status Fold(absl::Span<const float> delta, double weight,
                            absl::string_view contributor) = 0;
  // The strategy's part of ApplyInto: count() >= 1 and `base` has layout().
  virtual absl::StatusOr<AggregationReport> Combine(const tensor::FlatModel& base,
                                                    std::vector<float>& out) const = 0;
  // The strategy's part of Reset.
  virtual void Clear() = 0;

 private:
  tensor::ModelLayout layout_;
  int threads_;
  std::set<std::string, std::less<>> contributors_;
  double total_weight_ = 0;
};

// Which strategy, with which parameters.
struct StrategyOptions {
  common::v1::Aggregation kind = common::v1::AGGREGATION_MEAN;
  // The task's aggregation_options: only fields that `kind` uses may be set; unset ones take
  // their defaults.
  common::v1::AggregationOptions params;
  // > 1 splits the passes over large models across that many threads (started and joined in
  // each call). Results do not depend on it.
  int threads = 1;
};

// A configured strategy. Immutable, cheap to copy, thread-safe: any number of rounds may Start
// from one Strategy at the same time.
class Strategy {
 public:
  common::v1::Aggregation kind() const { return kind_; }
  // The friendly name a task file writes: "mean", "trimmed-mean", ...
  const std::string& name() const { return name_; }
  // The parameters with defaults applied.
  const common::v1::AggregationOptions& params() const { return params_; }
  // true: each update is folded in as it arrives (memory ~ one model whatever K).
  bool streaming() const { return streaming_; }
  // true: a round's result is the same to the bit whatever order its updates are added in
  // (every strategy but mean with float sums); a caller that needs bit-identical results may
  // then fold updates as they arrive.
  bool order_independent() const;
  // Bytes a round holds besides the caller's base and output buffers: `model_bytes` for a
  // streaming strategy (4 x with exact_sum), `updates` x `model_bytes` for the others.
  uint64_t RoundMemoryBytes(size_t updates, uint64_t model_bytes) const;
  // A round over `layout`. `expected_updates` (K, 0 if unknown) only sizes bookkeeping: a round
  // may end with more or fewer updates.
  std::unique_ptr<Aggregation> Start(tensor::ModelLayout layout, size_t expected_updates) const;

 private:
  friend absl::StatusOr<Strategy> MakeStrategy(const StrategyOptions& options);
  using StartFn = std::unique_ptr<Aggregation> (*)(tensor::ModelLayout layout,
                                                   size_t expected_updates, int threads,
                                                   const common::v1::AggregationOptions& params);
  Strategy() = default;

  common::v1::Aggregation kind_ = common::v1::AGGREGATION_UNSPECIFIED;
  std::string name_;
  common::v1::AggregationOptions params_;
  bool streaming_ = false;
  int threads_ = 1;
  StartFn start_ = nullptr;
};

// Makes the strategy `options` names. Errors: INVALID_ARGUMENT "<field>: <what>" for an
// unregistered kind, a parameter `kind` does not use, or a parameter out of range (paths as in
// a task file, e.g. "aggregation_options.trim_ratio: must be in [0, 0.5), got 0.5").
absl::StatusOr<Strategy> MakeStrategy(const StrategyOptions& options);
// The strategy of a task: its aggregation and aggregation_options, as above.
absl::StatusOr<Strategy> MakeStrategy(const common::v1::TaskSpec& spec, int threads = 1);

// The task-level rules of `aggregation` and `aggregation_options` (libs/task calls it from
// ValidateTaskSpec): the strategy is registered; options only for the strategy that uses them;
// ranges; and enough updates per round for the strategy (krum: >= 2f+3). `round_updates` is the
// fewest updates a round of the task aggregates (0: unknown, not checked), and `round_field`
// the task field that sets it (min_participants; async.buffer_size in federated-async; libs/task
// knows it from the task's mode). INVALID_ARGUMENT "<field path>: <what is wrong>".
absl::Status ValidateAggregation(const common::v1::TaskSpec& spec, uint64_t round_updates,
                                 absl::string_view round_field);

// Sets the unset parameters of the task's strategy to their defaults (e.g. trim_ratio 0.1 for
// trimmed-mean), so that a stored or shown task carries its effective settings. Leaves the
// parameters of other strategies alone (validation reports them) and adds no
// aggregation_options section to a strategy without parameters. Idempotent.
void ApplyAggregationDefaults(common::v1::TaskSpec& spec);

// How mean sums: kExact when its options set exact_sum.
Summation SummationOf(const common::v1::AggregationOptions& params);

// "trimmed-mean" for AGGREGATION_TRIMMED_MEAN; "unknown(<n>)" for a number the enum lacks.
std::string StrategyName(common::v1::Aggregation kind);
// The kinds that have a strategy, in registration order.
std::vector<common::v1::Aggregation> RegisteredStrategies();

}  // namespace shoal::aggregation
