#pragma once

// The seam between AggregatorCore and the kinds of aggregation a task can be in. The core keeps
// what every task has (its model versions, the staging pool, members, watches, metrics) and
// hands each request about aggregating to the task's current AggregationSession: a round
// (RoundSession, federated-sync, with its tree partial sums and differential privacy) or a
// federated-async buffer (BufferSession). MakeSession is the one place that picks the kind, from
// the request that opens it; a new kind of aggregation is one more implementation.
//
// Locking: the host's mu() guards every TaskState and every session's state. Methods marked
// "under mu()" are called with it held; the others take it themselves and run their passes over
// a model without it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/aggregation/weighted_mean.h"
#include "libs/common/clock.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/core_types.h"
#include "services/aggregator/parent_link.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

class AggregationSession;
class SecureExchange;

// What a task has whatever its session: its model versions and which child supernodes (and
// their backups) may read them. Guarded by the host's mu().
struct TaskState {
  struct Version {
    std::shared_ptr<const tensor::FlatModel> model;
    uint64_t digest = 0;
    // Its tensors' digests: computed by the first download that sends the version raw, kept for
    // the others (set by PublishVersion).
    std::shared_ptr<tensor::TensorDigests> tensor_digests = nullptr;
  };
  std::string name;
  std::map<uint64_t, Version> versions;
  uint64_t latest = 0;
  // Tree rounds: every child named in the task's rounds or buffer; each may read the models.
  std::set<std::string> children;
  // Replicas: per child, the backups that may act as it (from the rounds' child_backups).
  std::map<std::string, std::set<std::string>> child_backups;
  bool released = false;
  // The current (or last) session; null until the first OpenRound or OpenBuffer. Replaced, not
  // changed in place, so that a push or pass holding the old one sees that it is stale.
  std::shared_ptr<AggregationSession> session;
};

// What opens a session: the round or the buffer the coordinator asks for.
using OpenRequest = std::variant<OpenRoundParams, OpenBufferParams>;

// What sessions use of the core (AggregatorCore implements it).
class SessionHost {
 public:
  absl::Mutex& mu() const { return mu_; }
  const AggregatorCoreOptions& options() const { return options_; }
  const Clock& clock() const { return clock_; }
  AggregatorMetrics& metrics() const { return metrics_; }

  // Stores `model` as version `version` of `task`, now the latest. Under mu().
  virtual void PublishVersion(TaskState& task, uint64_t version,
                              std::shared_ptr<const tensor::FlatModel> model, uint64_t digest) = 0;
  // The oldest held version's buffer when publishing a version of `layout` will evict it and
  // nobody else holds it (saves the first-touch cost of a fresh model), else empty. Under mu().
  virtual std::vector<float> TakeEvictedBuffer(TaskState& task, uint64_t keep,
                                               const tensor::ModelLayout& layout) = 0;
  // Puts a model-sized buffer into the staging pool (freed when the pool is full: call it
  // without mu() where that can be).
  virtual void RecycleBuffer(std::vector<float> buffer) = 0;
  // Calls the task's watchers with `event`. Without mu().
  virtual void Notify(const std::string& task, const v1::TaskEvent& event) = 0;
  // A tree node's aggregate for its parent: queued for the ParentLink on the transfer pool
  // (apart from the folds); its buffer returns to the staging pool once sent. Without mu().
  virtual void Forward(const v1::ParentRound& parent, PartialResult aggregate) = 0;

 protected:
  SessionHost(AggregatorCoreOptions options, const Clock& clock, AggregatorMetrics& metrics)
      : options_(std::move(options)), clock_(clock), metrics_(metrics) {}
  ~SessionHost() = default;

  mutable absl::Mutex mu_;
  const AggregatorCoreOptions options_;
  const Clock& clock_;
  AggregatorMetrics& metrics_;
};

// Where BeginPush sends a push, from the session's checks.
struct PushTarget {
  std::shared_ptr<const tensor::FlatModel> model;  // the deltas' layout
  double max_norm = 0;
  double staleness_factor = 1;                     // a late round update's
  RejectReason reason = RejectReason::kMalformed;  // when the session refuses the push
  bool duplicate = false;                          // an accepted push, again
};

// What a session decided about a complete push.
struct Acceptance {
  absl::Status status;  // not OK: refused, for `reason`
  RejectReason reason = RejectReason::kRoundNotOpen;
  bool duplicate = false;     // a repeat of an update the session holds: nothing changed
  bool fold_pending = false;  // Fold() has work to do
  PushReplica replica;        // the copy for a round's backups (none: no backups)
};

// One kind of aggregation of one task: a round, a federated-async buffer. Thread-safe as
// described at the top of this file. The requests that do not fit the kind (a round's
// CloseRound on a buffer, a round-0 push into a round) are answered by the session with the
// status the proto's comments give.
class AggregationSession : public std::enable_shared_from_this<AggregationSession> {
 public:
  virtual ~AggregationSession() = default;

  // Under mu(). This session, made by MakeSession for a request on `task`, opens while the
  // task's session is `current` (null: none). Returns the session the task holds afterwards:
  // this one (the caller then abandons `current`) or `current` (a repeat it took, maybe
  // adjusting itself). An error leaves the task as it was.
  virtual absl::StatusOr<std::shared_ptr<AggregationSession>> Open(
      TaskState& task, const std::shared_ptr<AggregationSession>& current) = 0;
  // Under mu(). OK when a session of another kind may replace this one.
  virtual absl::Status CheckReplaceable(const TaskState& task) const = 0;
  // Under mu(). Replaced, or its task released: nothing enters it any more.
  virtual void Abandon() = 0;
  // Under mu(). A newer version was stored (a restore, or a tree node's version from its
  // parent). Returns the session the task holds from now on (this one, or a fresh one).
  virtual std::shared_ptr<AggregationSession> OnNewVersion(TaskState& task) = 0;

  // Pushes. Under mu(): may `meta` push into this session? Fills `target`.
  virtual absl::Status Target(TaskState& task, const PushMeta& meta, PushTarget& target) = 0;
  // Under mu(): a push of `peer` streams in (one at a time per peer), or ended.
  virtual void StartPushing(const std::string& peer) = 0;
  virtual void StopPushing(const std::string& peer) = 0;
  // Accepts a complete, validated update (norm checked) or refuses it. Cheap; takes mu().
  virtual Acceptance Accept(TaskState& task, PushedUpdate& update) = 0;
  // The slow part of an accepted update (a round folds it; a buffer aggregates when full).
  virtual void Fold(const std::shared_ptr<TaskState>& task, PushedUpdate& update) = 0;

  // Closing. CloseRound: aggregates and publishes (see AggregatorCore::CloseRound).
  virtual absl::StatusOr<RoundResult> Close(TaskState& task, uint64_t round) = 0;
  // A child's round closes into a partial sum for its parent (AggregatorCore::ClosePartial).
  virtual absl::StatusOr<std::shared_ptr<const PartialResult>> ClosePartial(TaskState& task,
                                                                            uint64_t round) = 0;

  // Tree partial sums. A child's partial sum (or a federated-async child's aggregate) enters.
  virtual absl::StatusOr<bool> AddPartial(const std::shared_ptr<TaskState>& task,
                                          const PartialMeta& meta,
                                          const aggregation::PartialSum& partial) = 0;
  // Under mu(): the values such a partial must have.
  virtual absl::StatusOr<size_t> PartialValues(const TaskState& task, uint64_t round) const = 0;
  // Under mu(): where `round` sends its partial sum (empty address: nowhere).
  virtual v1::ParentRound ParentOf(uint64_t round) const = 0;

  // Under mu(): what a new watcher learns first (the open round, the accepted peers).
  virtual void Describe(v1::WatchStarted& started) const = 0;

  // Under mu(): secure aggregation's `round` (SecureAggregate streams). The kinds without it
  // answer FAILED_PRECONDITION.
  virtual absl::StatusOr<std::shared_ptr<SecureExchange>> Secure(const TaskState& task,
                                                                 uint64_t round);
};

// The session a request opens, its settings checked (INVALID_ARGUMENT naming the field); it
// takes effect with AggregationSession::Open under the host's lock.
absl::StatusOr<std::shared_ptr<AggregationSession>> MakeSession(const OpenRequest& request,
                                                                SessionHost& host);

// "task 'name'" with the name escaped, for messages.
std::string TaskLabel(const std::string& task);
// "round N of task 'name'".
std::string RoundLabel(uint64_t round, const std::string& task);
// What a session opens on: OK when `base_version` is the task's latest version;
// FAILED_PRECONDITION naming it and the latest when it is not held or not the latest.
absl::Status CheckBaseIsLatest(const TaskState& task, uint64_t base_version);
// The PushAccepted event for an update that entered `round` (0: a buffer).
void NotifyAccepted(SessionHost& host, uint64_t round, const PushedUpdate& update);

}  // namespace shoal::aggregator
