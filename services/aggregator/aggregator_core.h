#pragma once

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
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/aggregation/weighted_mean.h"
#include "libs/common/clock.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_metrics.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/common/v1/tensor.pb.h"

namespace shoal::aggregator {

struct AggregatorCoreOptions {
  // Updates (and PutModel uploads) staged at once; each holds one model-sized buffer, so memory
  // is O(model x this), never O(model x peers).
  int max_concurrent_pushes = 4;
  // Model versions kept per task for GetModel (>= 2: the current and the previous).
  int versions_kept = 2;
  // Closed-round results kept per task for idempotent CloseRound.
  int closed_rounds_kept = 8;
  // Threads for the passes over a whole model (folding an update, applying the mean).
  int fold_threads = 2;
  // Bounds on models received with PutModel.
  tensor::DecoderLimits limits;
  // Update memory one round or federated-async buffer may hold (--max-buffer-bytes): a
  // non-streaming strategy holds its K updates (K x the model), a buffer K updates whatever the
  // strategy, mean's running sum one model. OpenRound/OpenBuffer answer RESOURCE_EXHAUSTED above
  // it. Staging buffers (max_concurrent_pushes) and the held model versions come on top.
  uint64_t max_buffer_bytes = uint64_t{4} << 30;

  absl::Status Validate() const;
};

struct PushMeta {
  std::string task;
  uint64_t round = 0;
  std::string peer_id;
  uint64_t base_version = 0;
  uint64_t num_samples = 0;
  double train_loss = 0;
  std::string session_token = "";    // UpdateMeta.session_token
  std::string caller_identity = "";  // the caller's TLS certificate name ("" for plaintext)
  int64_t train_ms = 0;              // UpdateMeta.train_ms
  std::string replicated_by = "";    // UpdateMeta.replicated_by: a primary's copy to its backup

  static PushMeta From(const v1::UpdateMeta& meta, std::string caller_identity);
  // The UpdateMeta this came from (caller_identity is not part of it).
  v1::UpdateMeta ToProto() const;
};

struct OpenRoundParams {
  std::string task;
  uint64_t round = 0;
  uint64_t base_version = 0;
  std::vector<std::string> expected_peers;
  double max_update_norm = 0;                // 0 = no bound
  v1::AggregationSettings aggregation = {};  // the round's strategy (unspecified: mean)
  // Stragglers: peers that may push one late update each (see OpenRoundRequest.late_peers).
  std::vector<std::string> late_peers = {};
  common::v1::AsyncSpec late_staleness = {};
  // Tree rounds: the child supernodes whose partial sums the round takes (AddPartial); mean
  // only; disjoint from the expected and late peers.
  std::vector<std::string> expected_children = {};
  // Tree rounds: set (address and child id) on a child's round, which closes into a partial sum
  // for that parent (ClosePartial) instead of publishing; mean only.
  v1::ParentRound parent = {};
  // Replicas: a primary's backups, or (standby_for, the primary's child id) a backup's round.
  std::vector<std::string> backups = {};
  std::string standby_for = "";
  // Replicas: (child, backup id) pairs: backups that may act as an expected child.
  std::vector<std::pair<std::string, std::string>> child_backups = {};
  std::string replica_id = "";  // the id a primary's copies carry (default: parent.child)
  // Differential privacy (level peer, see round_privacy.h); unset level: none.
  common::v1::DpSpec dp = {};

  static OpenRoundParams From(const v1::OpenRoundRequest& request);
};

// AggregatorService.OpenBuffer (the proto's comments are the contract).
struct OpenBufferParams {
  std::string task;
  uint64_t base_version = 0;
  common::v1::AsyncSpec async;  // buffer_size required; unset fields take their defaults
  v1::AggregationSettings aggregation;
  double max_update_norm = 0;   // 0 = no bound
  uint64_t last_version = 0;    // 0 = no limit
  v1::ParentRound parent = {};  // a tree's node below the root: forwards, never publishes
  std::vector<std::string> children = {};

  static OpenBufferParams From(const v1::OpenBufferRequest& request);
};

struct RoundResult {
  uint64_t version = 0;
  std::vector<std::string> contributors;  // sorted
  uint64_t num_samples = 0;
  double mean_train_loss = 0;
  uint64_t digest = 0;
  std::string note;          // the strategy's AggregationReport.note (e.g. a degraded krum)
  uint64_t model_bytes = 0;  // of the version the round left

  v1::CloseRoundResponse ToProto() const;
};

// Whether a caller with certificate `identity` is child supernode `child`: the certificate's own
// name, or "NAME@ADDRESS" where aggregators share one certificate NAME (as in deploy/k8s): the
// coordinator then names each child by its address too.
inline bool IsChildOf(const std::string& identity, const std::string& child) {
  return child == identity ||
         (child.size() > identity.size() + 1 && child.compare(0, identity.size(), identity) == 0 &&
          child[identity.size()] == '@');
}

// Tree rounds: who a partial sum of a round holds. A child sends it to its parent with its id
// in `child`; ClosePartial returns one with `child` empty.
struct PartialMeta {
  std::string task;
  uint64_t round = 0;
  std::string child = "";
  uint64_t base_version = 0;
  std::vector<std::string> contributors = {};  // the peers summed, sorted: one term each
  uint64_t num_samples = 0;
  double loss_sum = 0;  // sum of train_loss x num_samples
};

struct PartialResult {
  PartialMeta meta;
  aggregation::PartialSum sum;
};

struct ModelSnapshot {
  uint64_t version = 0;
  std::shared_ptr<const tensor::FlatModel> model;
};

struct PutResult {
  uint64_t version = 0;
  uint64_t digest = 0;
};

class UpdateBuffer;

// The aggregator's domain state: per task the held model versions, the current round (expected
// peers, accepted contributors, the round's aggregation) or the federated-async buffer, and the
// pool of staging buffers that in-flight pushes decode into. A push is validated chunk by chunk
// while it streams and enters the aggregate only once it is complete and valid, so a bad update
// never touches it. Mean rounds fold each update into a running sum right after accepting it;
// the other strategies keep the round's updates and compute at CloseRound; a buffer keeps up to
// async.buffer_size updates and aggregates them into the next version when it is full. Owned by
// the server; thread-safe. CPU-heavy calls (Push::Fold, CloseRound, PutModel) may block briefly
// on other folds and belong on an executor, not in a reaction.
// Implementation: aggregator_core.cc (models, members, watches, pushes), aggregator_rounds.cc,
// aggregator_buffer.cc.
class AggregatorCore {
 public:
  struct Task;
  struct Round;
  class Push;

  static absl::StatusOr<std::unique_ptr<AggregatorCore>> Create(AggregatorCoreOptions options,
                                                                const Clock& clock,
                                                                AggregatorMetrics& metrics);
  ~AggregatorCore();

  // Stores a model version (see PutModel in aggregator.proto for the rules). A newer version (a
  // restore) abandons the open round, or empties the task's buffer (which stays open, now on
  // that version); a tree node's buffer (with a parent) keeps its updates.
  absl::StatusOr<PutResult> PutModel(const std::string& task, uint64_t version,
                                     tensor::FlatModel model);
  // The latest version, or exactly `version`. NOT_FOUND for an unknown task or version.
  absl::StatusOr<ModelSnapshot> GetModel(const std::string& task,
                                         std::optional<uint64_t> version) const;
  // Opens a round with the strategy `params.aggregation` names, for K = the expected peers.
  // Errors: see OpenRound in aggregator.proto; RESOURCE_EXHAUSTED names the strategy's memory
  // and max_buffer_bytes; FAILED_PRECONDITION also for a task in buffer mode, or a re-open
  // with another strategy.
  absl::Status OpenRound(const OpenRoundParams& params);
  // Aggregates the round (waiting for accepted folds) and publishes the next version; the
  // strategy's note is in RoundResult::note.
  absl::StatusOr<RoundResult> CloseRound(const std::string& task, uint64_t round);
  // Tree rounds (aggregator_partials.cc). A child's partial sum of the open round: added as if
  // the child's contributors had pushed here; the child must be one of the round's
  // expected_children, the round's strategy mean, the partial's summation the round's. Returns
  // true for a repeat of an accepted partial (nothing changes). Errors: NOT_FOUND unknown task;
  // FAILED_PRECONDITION round not open, child not expected, another base version, a contributor
  // already in the round; INVALID_ARGUMENT a bad partial (the other summation, size, non-finite
  // value, over the exact bound, contributors and terms disagree); nothing added.
  // Round 0: a federated-async tree; the child's aggregate (its full buffer's, total_weight 1)
  // enters the task's buffer as one update of meta.num_samples, with the staleness of
  // meta.base_version and the contributors listed in the version it goes into; the child must
  // be one of the buffer's children. A full buffer is aggregated on this thread.
  absl::StatusOr<bool> AddPartial(const PartialMeta& meta, const aggregation::PartialSum& partial);
  // Closes a child's round without publishing: waits for its folds and returns its partial sum
  // (mean only) for the parent. Idempotent: a repeat returns the same partial. Errors: NOT_FOUND
  // unknown task or round; FAILED_PRECONDITION the round's strategy is not mean or it was
  // closed by CloseRound.
  absl::StatusOr<std::shared_ptr<const PartialResult>> ClosePartial(const std::string& task,
                                                                    uint64_t round);
  // The parent of `round` (OpenRoundParams::parent); an empty address when it is not a child's
  // round or is unknown.
  v1::ParentRound ParentOf(const std::string& task, uint64_t round) const;
  // The values a partial sum for the open `round` must have (its base model's), checked before
  // one is received. NOT_FOUND unknown task; FAILED_PRECONDITION the round is not open.
  absl::StatusOr<size_t> PartialValues(const std::string& task, uint64_t round) const;
  // May this caller push child `child`'s partial sum? Plaintext, the coordinator's certificate
  // or the child's own (IsChildOf); PERMISSION_DENIED otherwise.
  static absl::Status CheckPartialCaller(const std::string& child, const std::string& identity);
  // The same, also letting a backup of `child` in the task's rounds (OpenRoundParams::
  // child_backups) act as it.
  absl::Status CheckChildCaller(const std::string& task, const std::string& child,
                                const std::string& identity) const;
  // Switches the task to its federated-async buffer (see OpenBuffer in aggregator.proto). A
  // repeat with the same settings is OK while the buffer is open (whatever versions it has
  // published since); other settings on the latest version open a new, empty buffer (updates
  // waiting in the old one are dropped, as an abandoned round's). An open round is abandoned.
  // Errors: NOT_FOUND, INVALID_ARGUMENT (settings), FAILED_PRECONDITION (base version not
  // held or not the latest), ABORTED (a round is closing), RESOURCE_EXHAUSTED (memory).
  // A repeat that changes only async.buffer_size or the children adjusts the open buffer and
  // keeps its updates. With a parent, each full buffer's aggregate goes to the forwarder (see
  // SetForwarder) instead of being published.
  absl::Status OpenBuffer(const OpenBufferParams& params);
  // Federated-async trees: what sends a node's aggregate to its parent (PushPartial, round 0),
  // called on the thread that aggregated it, with no lock held; an error is logged and counted
  // (the aggregate's updates are lost, as an abandoned round's). Set once, before serving.
  using ForwardFn =
      std::function<absl::Status(const v1::ParentRound& parent, const PartialResult& aggregate)>;
  void SetForwarder(ForwardFn forward) { forward_ = std::move(forward); }
  void ReleaseTask(const std::string& task);

  // Replaces the task's peers and their session tokens (from the coordinator).
  void SetMembers(const std::string& task, std::map<std::string, std::string> session_tokens);
  // May this caller act for `peer_id` in `task`? A call without a peer id is the coordinator's
  // own (allowed when plaintext or from the certificate named "coordinator"); a peer's call must
  // come from its own certificate (when TLS) and, once the task's members are set, carry the
  // peer's current session token. Errors: PERMISSION_DENIED, UNAUTHENTICATED.
  absl::Status CheckCaller(const std::string& task, const std::string& peer_id,
                           const std::string& session_token, const std::string& identity) const;
  // May this caller read `task`'s models (GetModel)? As CheckCaller, and besides a child
  // supernode named in the task's rounds (expected_children), with no session token: `peer_id`
  // is its id and, when TLS, its certificate.
  absl::Status CheckReader(const std::string& task, const std::string& peer_id,
                           const std::string& session_token, const std::string& identity) const;

  // Watches a task (AggregatorService.WatchTask): `on_event` gets a WatchStarted with the task's
  // current state at once (on this thread), then a PushAccepted for every update accepted, on
  // the thread that accepted it, and (buffer mode) a VersionPublished for every version the
  // buffer publishes, on the thread that aggregated it. In buffer mode WatchStarted has
  // open_round 0 and `accepted` lists the peers whose updates are accepted but not yet in a
  // published version (waiting in the buffer or being aggregated). It must not block (queue and
  // return) and must not call back into this core. Events may arrive in any order (each
  // PushAccepted only adds to the accepted set; a VersionPublished lists its contributors), and
  // a call may still be in progress when Unwatch returns: the callback must guard what it
  // captures (e.g. a weak reference).
  using TaskEventFn = std::function<void(const v1::TaskEvent&)>;
  uint64_t Watch(const std::string& task, TaskEventFn on_event);
  void Unwatch(uint64_t handle);

  // One staged upload slot (PutModel). RESOURCE_EXHAUSTED when all are in use.
  class StagingLease {
   public:
    explicit StagingLease(AggregatorCore* core) : core_(core) {}
    StagingLease(StagingLease&& other) noexcept : core_(other.core_) { other.core_ = nullptr; }
    StagingLease& operator=(StagingLease&&) = delete;
    ~StagingLease();

   private:
    AggregatorCore* core_;
  };
  absl::StatusOr<StagingLease> AcquireStaging();

  // Starts a push: checks task, round (or buffer: round 0), peer and base version, and leases a
  // staging buffer. Returns nullptr (OK) when this peer's update for the round was already
  // accepted (the caller answers duplicate=true). Rejections are counted in the metrics.
  absl::StatusOr<std::unique_ptr<Push>> BeginPush(const PushMeta& meta);

  // An in-flight push. Feed it frames as they arrive, then Accept() and Fold() (or Commit(),
  // which does both). Accept() is the decision: once it returns OK the update is counted in
  // the round (contributors, samples) and CloseRound waits for its fold, or it is in the buffer,
  // so the caller may acknowledge the push before the fold, the one slow pass, has run. For a
  // buffer push Fold() aggregates the buffer into the next version when this update filled it.
  // Destroying it (at any point) returns its staging buffer; destroying an accepted push that
  // was not folded folds it first, so an acknowledged update is never lost. Not thread-safe; one
  // caller at a time.
  class Push {
   public:
    ~Push();
    // Validates one frame (layout, dtype, size, digest, finite values). The first error is
    // counted as a rejection; after it every call returns the same error.
    absl::Status AddFrame(const common::v1::TensorFrame& frame);
    // Same for a chunk frame whose bytes arrive as pieces (zero-copy receive path).
    absl::Status AddChunkParts(absl::Span<const absl::string_view> parts);
    // Checks that the update is complete and within the norm bound and that the round is
    // still open (buffer: that it is still admitted), and accepts it: from here on the update is
    // part of the round's aggregate (a CloseRound waits until Fold() has run) or of the buffer.
    // Cheap: no pass over the model. FAILED_PRECONDITION when the round closed meanwhile.
    absl::Status Accept();
    // Folds an accepted round update into the round's aggregation (one pass over the model), or
    // aggregates a buffer this update filled (K folds and a pass; more when the buffer fills
    // again meanwhile). CPU-heavy, belongs on an executor. No-op when there is nothing to do.
    void Fold();
    // Accept() and, when it succeeds, Fold().
    absl::Status Commit();
    // Counts the push as rejected for `reason` (e.g. its stream broke); idempotent.
    void Reject(RejectReason reason);
    // Buffer pushes: true once Accept() found a repeat of the peer's update in the buffer or in
    // the version just aggregated (same base version, samples, loss and values): nothing
    // changed, and the caller answers duplicate=true.
    bool duplicate() const { return duplicate_; }
    uint64_t bytes_received() const { return decoder_.bytes_received(); }
    const PushMeta& meta() const { return meta_; }
    // Replicas: after Accept(), the copy a primary sends its backups (the peer's meta with
    // replicated_by set, and the update); empty `backups` when the round has none.
    struct Replica {
      std::vector<std::string> backups;
      v1::UpdateMeta meta;
      std::shared_ptr<const tensor::FlatModel> update;
    };
    Replica TakeReplica() { return std::move(replica_); }

   private:
    friend class AggregatorCore;
    Push(AggregatorCore* core, std::shared_ptr<Task> task, std::shared_ptr<Round> round,
         std::shared_ptr<UpdateBuffer> buffer, PushMeta meta, tensor::FrameDecoder decoder,
         double max_norm, double staleness_factor);
    absl::Status RejectWith(RejectReason reason, absl::Status status);

    AggregatorCore* core_;
    std::shared_ptr<Task> task_;
    std::shared_ptr<Round> round_;          // round pushes
    std::shared_ptr<UpdateBuffer> buffer_;  // buffer pushes (round 0)
    PushMeta meta_;
    tensor::FrameDecoder decoder_;
    double max_norm_;
    double staleness_factor_;    // a late round update's delta is scaled by it (else 1)
    double sum_squares_ = 0;     // of the complete update
    std::vector<float> values_;  // the complete update; returned to the pool on destruction
    bool done_ = false;          // accepted or rejected (counted)
    bool fold_pending_ = false;  // round: accepted, holds a folds_in_flight count, not yet
                                 // folded; buffer: must run the buffer's passes
    bool duplicate_ = false;
    Replica replica_;  // set by Accept() when the round has backups
  };

 private:
  // Where a push goes, from BeginPush's checks.
  struct PushTarget;

  AggregatorCore(AggregatorCoreOptions options, const Clock& clock, AggregatorMetrics& metrics);
  std::shared_ptr<Task> FindTask(const std::string& task) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EvictOldVersions(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbandonRound(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties the task's buffer after a restore; returns the old one (to free outside mu_).
  std::shared_ptr<UpdateBuffer> ResetBuffer(Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The oldest held version's buffer when publishing a version of `layout` will evict it and
  // nobody else holds it (saves the first-touch cost of a fresh model), else empty.
  std::vector<float> TakeEvictedBuffer(Task& task, uint64_t keep, const tensor::ModelLayout& layout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `model` as version `version`, now the latest.
  void PublishVersion(Task& task, uint64_t version, std::shared_ptr<const tensor::FlatModel> model,
                      uint64_t digest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseStaging(std::vector<float> buffer);
  // Puts a model-sized buffer into the staging pool; returns it when the pool is full, for the
  // caller to free outside mu_.
  std::vector<float> RecycleBuffer(std::vector<float> buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the task's watchers with `event` (outside mu_).
  void Notify(const std::string& task, const v1::TaskEvent& event) ABSL_LOCKS_EXCLUDED(mu_);
  void NotifyAccepted(const Push& push) ABSL_LOCKS_EXCLUDED(mu_);

  // Rounds (aggregator_rounds.cc).
  // A straggler's late update (see OpenRoundRequest.late_peers) goes into the open round.
  absl::Status TargetLateRound(Task& task, const PushMeta& meta, PushTarget& target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replicas: a primary's copy needs a round that is (or was) its backup; a peer's own push, a
  // round that is not a standby.
  absl::Status CheckReplica(const Round& round, const PushMeta& meta, PushTarget& target) const;
  absl::Status TargetRound(Task& task, const PushMeta& meta, PushTarget& target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AcceptRoundPush(Push& push);
  void FoldRoundPush(Push& push);
  // CloseRound's and ClosePartial's first step: marks the open round closing and waits until
  // no fold is in flight. INTERNAL (the round abandoned) when an accepted update's fold failed.
  absl::Status FinishFolds(Round& round, const std::string& label)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Buffers (aggregator_buffer.cc).
  absl::Status TargetBuffer(Task& task, const PushMeta& meta, PushTarget& target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AcceptBufferPush(Push& push);
  // Aggregates the buffer while it is full (the caller claimed its passes).
  void RunBufferPasses(const std::shared_ptr<Task>& task,
                       const std::shared_ptr<UpdateBuffer>& buffer) ABSL_LOCKS_EXCLUDED(mu_);

  // A child node's full buffer: its aggregate goes to the parent.
  void ForwardAggregate(const v1::ParentRound& parent, const PartialResult& aggregate)
      ABSL_LOCKS_EXCLUDED(mu_);
  // AddPartial of round 0: a child's aggregate into the task's buffer.
  absl::StatusOr<bool> AddBufferPartial(const PartialMeta& meta,
                                        const aggregation::PartialSum& aggregate);

  const AggregatorCoreOptions options_;
  const Clock& clock_;
  ForwardFn forward_;
  AggregatorMetrics& metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Task>> tasks_ ABSL_GUARDED_BY(mu_);
  // task -> peer id -> session token, as last set by the coordinator.
  std::map<std::string, std::map<std::string, std::string>> members_ ABSL_GUARDED_BY(mu_);
  int leases_ ABSL_GUARDED_BY(mu_) = 0;
  // Watchers by handle: {task, callback}. Watch() holds mu_ then watch_mu_; Notify() copies the
  // callbacks under watch_mu_ alone and calls them with no lock held.
  absl::Mutex watch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<uint64_t, std::pair<std::string, std::shared_ptr<const TaskEventFn>>> watchers_
      ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(watch_mu_) = 1;
  std::vector<std::vector<float>> free_buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::aggregator
