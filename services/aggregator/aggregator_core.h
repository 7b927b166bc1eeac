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
#include "libs/common/executor.h"
#include "libs/tensor/buffer_pool.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/core_types.h"
#include "services/aggregator/parent_forwarder.h"
#include "services/aggregator/parent_link.h"
#include "services/aggregator/sessions/session.h"
#include "services/aggregator/task_calls.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/common/v1/tensor.pb.h"

namespace shoal::aggregator {

// The aggregator's domain state: per task the held model versions and its aggregation session
// (sessions/session.h: a round or a federated-async buffer, which this core hands every
// aggregating request to without looking at its kind), and the pool of staging buffers that
// in-flight pushes decode into. A push is validated chunk by chunk while it streams and enters
// the aggregate only once it is complete and valid, so a bad update never touches it. Mean rounds
// fold each update into a running sum right after accepting it; the other strategies keep the
// round's updates and compute at CloseRound; a buffer keeps up to async.buffer_size updates and
// aggregates them into the next version when it is full. Owned by the server; thread-safe.
// CPU-heavy calls (Push::Fold, CloseRound, PutModel) may block briefly on other folds and belong on
// an executor, not in a reaction. A tree node's aggregates go to its parent over the ParentLink on
// a transfer thread of the core's own, apart from the folds.
class AggregatorCore final : private SessionHost {
 public:
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
  // Storage for a model about to be stored (PutModel: one uploaded, or fetched from the parent):
  // a model-sized buffer kept for the pushes (a released staging buffer, an evicted version),
  // or an empty one when none is kept. Its contents are left over.
  std::vector<float> TakeBuffer() { return staging_buffers_->Take(); }
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
  // Secure aggregation: the exchange of `task`'s open secure round `round`, for a SecureAggregate
  // stream. NOT_FOUND unknown task; FAILED_PRECONDITION no such round open.
  absl::StatusOr<std::shared_ptr<SecureExchange>> SecureRound(const std::string& task,
                                                              uint64_t round) const;
  // Tree rounds. A child's partial sum of the open round: added as if
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
  // keeps its updates. With a parent, each full buffer's aggregate goes to the parent link (see
  // SetParentLink) instead of being published.
  absl::Status OpenBuffer(const OpenBufferParams& params);
  // Federated-async trees: what sends a node's aggregate to its parent (PushPartial, round 0),
  // on the core's transfer thread, with no lock held; temporary errors are retried a few times,
  // then the aggregate is logged and counted as lost (its updates are lost, as an abandoned
  // round's). Set once, before serving; without one every aggregate is lost.
  void SetParentLink(ParentLink* link) { forwarder_->SetLink(link); }
  // Waits until every aggregate queued for the parent link was sent or given up on (tests).
  void AwaitTransfers() { forwarder_->AwaitIdle(); }
  // Forgets `task`; returns the newest version it held of it (none: no model, or no task).
  std::optional<uint64_t> ReleaseTask(const std::string& task);
  // The tasks this aggregator holds anything of (models, a session, members) or that are
  // watched, and the number of the coordinator's latest call that sets one up here, for a
  // registration to name (RegisterAggregatorRequest.tasks).
  TaskCalls::Held Held() const { return calls_.Snapshot(); }
  // Forgets `task` as ReleaseTask does, unless the coordinator called about it (PutModel,
  // OpenRound, OpenBuffer, SetMembers, Watch) after `as_of`, the Held::as_of of the
  // registration that named it: a registration's answer never frees a task given here again
  // meanwhile. Whether it forgot one.
  bool ReleaseUnlessCalledSince(const std::string& task, uint64_t as_of);
  // Called whenever a version of a task is published after another the core still holds (a
  // round's or a buffer's aggregate, a PutModel), with the task, the new version and the one
  // before it (e.g. to encode downloads against it). It runs with the core's lock held: it must
  // not block or call back into the core. nullptr clears it.
  using PublishedFn = std::function<void(const std::string& task, const ModelSnapshot& published,
                                         const ModelSnapshot& previous)>;
  void SetOnPublished(PublishedFn on_published) ABSL_LOCKS_EXCLUDED(mu_);

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
    const PushMeta& meta() const { return update_.meta; }
    // Replicas: after Accept(), the copy a primary sends its backups; empty `backups` when the
    // round has none.
    using Replica = PushReplica;
    Replica TakeReplica() { return std::move(replica_); }

   private:
    friend class AggregatorCore;
    Push(AggregatorCore* core, std::shared_ptr<TaskState> task,
         std::shared_ptr<AggregationSession> session, PushMeta meta, tensor::FrameDecoder decoder,
         double max_norm, double staleness_factor);
    absl::Status RejectWith(RejectReason reason, absl::Status status);

    AggregatorCore* core_;
    std::shared_ptr<TaskState> task_;
    std::shared_ptr<AggregationSession> session_;  // where it goes: a round, a buffer
    tensor::FrameDecoder decoder_;
    double max_norm_;
    PushedUpdate update_;        // once complete (Accept)
    bool done_ = false;          // accepted or rejected (counted)
    bool fold_pending_ = false;  // accepted, and the session's Fold has work to do
    bool duplicate_ = false;
    Replica replica_;  // set by Accept() when the round has backups
  };

 private:
  AggregatorCore(AggregatorCoreOptions options, const Clock& clock, AggregatorMetrics& metrics);
  std::shared_ptr<TaskState> FindTask(const std::string& task) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The task and its session, for a request about aggregating. NOT_FOUND for an unknown task;
  // `none` when it has no session yet (no OpenRound or OpenBuffer).
  absl::Status FindSession(const std::string& task, std::shared_ptr<TaskState>& found,
                           std::shared_ptr<AggregationSession>& session, absl::Status none) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // OpenRound and OpenBuffer: MakeSession, then AggregationSession::Open.
  absl::Status Open(const std::string& task, const OpenRequest& request);
  // ReleaseTask's work, run by calls_ (whose lock is taken before mu_).
  std::optional<uint64_t> Forget(const std::string& task) ABSL_LOCKS_EXCLUDED(mu_);
  void EvictOldVersions(TaskState& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseStaging(std::vector<float> buffer);

  // SessionHost.
  void PublishVersion(TaskState& task, uint64_t version,
                      std::shared_ptr<const tensor::FlatModel> model, uint64_t digest) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<float> TakeEvictedBuffer(TaskState& task, uint64_t keep,
                                       const tensor::ModelLayout& layout) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecycleBuffer(std::vector<float> buffer) override;
  void Notify(const std::string& task, const v1::TaskEvent& event) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Forward(const v1::ParentRound& parent, PartialResult aggregate) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    forwarder_->Forward(parent, std::move(aggregate));
  }

  TaskCalls calls_;  // its lock is taken before mu_
  std::map<std::string, std::shared_ptr<TaskState>> tasks_ ABSL_GUARDED_BY(mu_);
  // task -> peer id -> session token, as last set by the coordinator.
  std::map<std::string, std::map<std::string, std::string>> members_ ABSL_GUARDED_BY(mu_);
  int leases_ ABSL_GUARDED_BY(mu_) = 0;
  // Watchers by handle: {task, callback}. Watch() holds mu_ then watch_mu_; Notify() copies the
  // callbacks under watch_mu_ alone and calls them with no lock held.
  absl::Mutex watch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<uint64_t, std::pair<std::string, std::shared_ptr<const TaskEventFn>>> watchers_
      ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(watch_mu_) = 1;
  // Model-sized buffers for pushes to decode into: released staging buffers, evicted versions,
  // folded updates, forwarded aggregates.
  const std::shared_ptr<tensor::BufferPool> staging_buffers_;
  PublishedFn on_published_ ABSL_GUARDED_BY(mu_);
  // A federated-async tree node's aggregates on their way to the parent, on a transfer thread
  // apart from the folds. Destroyed (drained and joined) first, in the destructor.
  std::unique_ptr<ParentForwarder> forwarder_;
};

}  // namespace shoal::aggregator
