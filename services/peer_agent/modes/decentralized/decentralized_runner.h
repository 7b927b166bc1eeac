#pragma once

// Decentralized mode (Disco's round protocol without an aggregator), peer side. The protocol is
// in docs/explanation/decentralized.md and protos/shoal/coordinator/v1/session.proto.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/aggregation/strategy.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"
#include "libs/rpc/pacer.h"
#include "libs/rpc/retry.h"
#include "libs/tensor/buffer_pool.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/modes/decentralized/aggregate.h"
#include "services/peer_agent/modes/decentralized/kept_model.h"
#include "services/peer_agent/modes/decentralized/secure_round.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "services/peer_agent/update_privacy.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

struct DecentralizedRunnerOptions {
  // One Probe attempt; a participant is unreachable after `probe_attempts` failed attempts.
  absl::Duration probe_timeout = absl::Seconds(2);
  int probe_attempts = 2;
  // One GetSnapshot attempt during sharing and model sync: fetch_timeout plus the model's bytes
  // at slowest_link (bytes/s; 1 Mbit/s), so that a large model over a home uplink is not cut off
  // while it still moves (FetchAttemptTimeout).
  absl::Duration fetch_timeout = absl::Seconds(30);
  double slowest_link = rpc::kSlowestLink;
  // With a streaming strategy (mean): the most round updates fetched at once while sharing,
  // and so about the most a peer holds besides its own (each is folded in, then its storage
  // kept for the next).
  size_t fetch_window = 2;
  // With the float mean, whose fold takes the updates in ascending id order: where the updates
  // a participant fetches take at most this many bytes together (a small model), it fetches
  // from the ids after its own first, as with exact sums, and those that come before their turn
  // wait in memory.
  size_t hold_bytes = size_t{64} << 20;
  // A larger model is fetched that way too where the fetches of the round before ran slower than
  // this (bytes/s: the models' bytes over the fetches' time; before the first fetches, the
  // peer's measured upload, ModeRunnerDeps::measured_upload; links like users', where the
  // uplinks bound the exchange), the updates that come before their turn waiting in memory up to
  // hold_bytes and beyond that on disk, in spill files in ModeRunnerDeps::scratch_dir
  // (WaitingUpdates). Faster (one machine, a datacenter), where writing them would cost more
  // than the uplinks' balance gains, in ascending order, holding about fetch_window updates.
  // Infinity: from the first round on, whatever the speed.
  double rotate_below_rate = rpc::kSlowUplinkBelow;
  // Total time a model sync keeps retrying (the task's round_deadline_seconds when set).
  absl::Duration sync_budget = absl::Seconds(60);
  BackoffOptions retry_backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};
  // After a ModelPublished that is not the last round's: how long to wait for the next
  // RoundOpen before evaluating (when it comes, the evaluation runs after this peer's JoinRound).
  absl::Duration next_round_grace = absl::Milliseconds(100);
};

// The bound of one GetSnapshot attempt that moves about `bytes`: fetch_timeout plus the bytes at
// slowest_link.
inline absl::Duration FetchAttemptTimeout(const DecentralizedRunnerOptions& options, size_t bytes) {
  return rpc::TransferTimeout(options.fetch_timeout, bytes, options.slowest_link);
}

// The peer side of one decentralized task. Holds the model of the last completed round it took
// part in (or synced to); per round: RoundOpen -> JoinRound, train, publish ROUND_UPDATE,
// RoundReady; PeerList -> probe the others in parallel -> ConnectionsReport; StartSharing or
// PeerList{sharing} -> fetch the others' ROUND_UPDATEs, aggregate them with the task's strategy
// as deltas against the round's base as they arrive (RoundFold: in peer-id order, leaving out
// updates over max_update_norm; with mean, a few fetches at a time, each update freed once in),
// load, publish GLOBAL, SharingDone; ModelPublished -> EvalReport; SyncFrom -> fetch the provider's
// GLOBAL, load, SyncDone, ModelHeld; JoinRefused / ConnectionFailed -> back to the pre-round model.
// With compression the ROUND_UPDATE is the delta against the round's base, compressed, and every
// participant (this one too) folds the deltas as decoded, so all still end bit-identical; top-k's
// residual stays with this peer (restored when it leaves a round). With secure aggregation the
// ROUND_UPDATE is served only masked (SecureRound: masked at each PeerList, the others' masked
// updates fetched, seeds revealed on Unmask, the mean of the survivors made on MaskReveals;
// decentralized_secure.cc). Optimizer state and the residual stay local (reset after a sync).
// The round flow is in decentralized_runner.cc, the exchange with the other participants
// (probes, sharing, sync) in decentralized_sharing.cc.
// Owned by the agent, which makes it through the mode registry; the deps must outlive it.
// Threading: see ModeRunner (Intercept() records the latest RoundOpen's offer, which
// Supersedes() and the worker read under its mutex; everything else on the worker, plus one
// thread per participant while probing or fetching, joined before the handler returns).
class DecentralizedRunner final : public ModeRunner {
 public:
  // Errors: INVALID_ARGUMENT when a dependency is missing (with secure aggregation: the identity
  // key), the task is not decentralized or its aggregation settings make no strategy.
  static absl::StatusOr<std::unique_ptr<DecentralizedRunner>> Create(
      ModeRunnerDeps deps, DecentralizedRunnerOptions options = {});

  // Holds the model kept on disk for this task (ModeRunnerDeps::state_dir), else the seed's
  // initial model (round 0), and sends ModelHeld.
  void Start() override;
  // Removes the model kept on disk.
  void Finished() override;
  void Handle(const coordinator::v1::CoordinatorEvent& event,
              const std::function<bool()>& keep_going) override;
  // Records the round and offer of each RoundOpen as it arrives; consumes nothing.
  bool Intercept(const coordinator::v1::CoordinatorEvent& event) override;
  // RoundOpen, JoinRefused, PeerList, StartSharing, ConnectionFailed, SyncFrom, TaskAssigned and
  // TaskFinished stop the current step (training, probing, fetching); a JoinRefused of an offer
  // older than the latest RoundOpen of its round does not (it is ignored).
  bool Supersedes(const coordinator::v1::CoordinatorEvent& event) const override;

 private:
  friend class DecentralizedRunnerProbe;  // the tests' reader
                                          // (tests/service/decentralized_test_peer.h)

  // The round this peer takes part in (from RoundOpen until the next round or a refusal).
  struct RoundState {
    uint64_t round = 0;
    bool ready = false;  // trained and published its update
    uint64_t num_samples = 0;
    double train_loss = 0;
    int64_t train_ms = 0;
    // This peer's trained weights; with compression their delta against the base, as decoded.
    std::shared_ptr<const tensor::FlatModel> update;
    // The aggregate of the participants' updates, folded as they arrive (reset when the
    // participants change, and once the round's aggregate is made).
    std::optional<RoundFold> fold;
    std::optional<uint32_t> shared_attempt;  // last SharingDone sent
    // The model held before the round, once held_ is the average.
    std::shared_ptr<const tensor::FlatModel> base;
    // The trainer's optimizer state and data position before the round: a round the peer leaves
    // leaves no trace (training it again trains the same batches the same way).
    std::optional<training::TrainerProgress> progress;
    // The compressor before this round's update (its residual), for the same reason.
    std::optional<tensor::Compressor> compressor;
    // Secure aggregation: the masking, the others' masked updates, the reveals.
    std::optional<SecureRound> secure;
  };

  DecentralizedRunner(ModeRunnerDeps deps, DecentralizedRunnerOptions options,
                      aggregation::Strategy strategy, UpdatePrivacy noise);

  void HandleRoundOpen(const coordinator::v1::RoundOpen& m,
                       const std::function<bool()>& keep_going);
  void HandlePeerList(const coordinator::v1::PeerList& m, const std::function<bool()>& keep_going);
  void Share(uint64_t round, uint32_t attempt, const std::function<bool()>& keep_going);
  // Secure aggregation (decentralized_secure.cc): masks over a PeerList and serves the masked
  // update (false: it cannot, and said so); fetches the participants' masked updates
  // (MaskedUpdatesHeld); reveals the seeds for the survivors (Unmask); removes the masks and
  // averages (MaskReveals).
  bool MaskForPeerList(const coordinator::v1::PeerList& m);
  void ShareMasked(uint64_t round, uint32_t attempt, const std::function<bool()>& keep_going);
  void HandleUnmask(const coordinator::v1::Unmask& m);
  void HandleMaskReveals(const coordinator::v1::MaskReveals& m);
  // Makes `model` (the round's aggregate) the held model, publishes it as GLOBAL and answers
  // SharingDone.
  void CompleteSharing(uint64_t round, uint32_t attempt, tensor::FlatModel model,
                       uint64_t num_samples, absl::Time start, const std::string& what);
  // The round's shared base: the model every participant held before the round.
  const tensor::FlatModel& RoundBase() const;
  // Secure aggregation: the RoundReady fields (this round's signed mask key).
  absl::Status AddMaskKey(coordinator::v1::RoundReady& ready) const;
  // Evaluates the published model and sends EvalReport; when the next round is already queued
  // (keep_going false) the evaluation waits until this peer has sent that round's JoinRound.
  void HandleModelPublished(const coordinator::v1::ModelPublished& m,
                            const std::function<bool()>& keep_going);
  void RunPendingEval();
  void EvaluateAndReport(uint64_t round, uint64_t version);
  void HandleSyncFrom(const coordinator::v1::SyncFrom& m, const std::function<bool()>& keep_going);
  // Forgets the state of an older round this peer already averaged (its ModelPublished may not
  // have come), so that refusing `round` does not undo it.
  void DropCompletedRoundBefore(uint64_t round);
  // Drops the round and makes the trainer hold `held_` again (the pre-round model when the
  // round was already averaged here).
  void AbandonRound(const std::string& why);
  // Makes the trainer's parameters equal `held_` when training changed them.
  absl::Status RestoreHeld();
  // The round update of `trained` (from the base held_) as published: the model itself, or with
  // compression its delta encoded (into `encoded`) and decoded. Records the compressor's state
  // before it in round_.
  absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> MakeUpdate(
      tensor::FlatModel trained, std::shared_ptr<const tensor::EncodedModel>* encoded);
  // Round updates travel as compressed deltas (the task sets a compression).
  bool compressed() const { return compressor_.settings().codec != common::v1::ENCODING_RAW; }
  void SendModelHeld();
  // Serves held_ as this peer's GLOBAL snapshot of model_round_ (what joiners sync from).
  void PublishHeld(uint64_t num_samples, double loss);
  // Makes the model kept on disk for a restart held_ (held_ once a round completed or a sync
  // loaded it); Start() loads it back (true: held_ is now that model).
  void KeepHeld();
  bool HoldKeptModel();
  // Sends JoinRound, the answer to `m`.
  void SendJoin(const coordinator::v1::RoundOpen& m);
  // The refusal of a JoinRound that answered an earlier RoundOpen of the round than the latest
  // one received: the answer to that one (sent, or queued to be sent) stands or gets its own
  // refusal.
  bool RefusesAnEarlierOffer(const coordinator::v1::JoinRefused& m) const;
  // A fold of the current round over `ids`: spent_fold_ restarted when there is one of the
  // trainer's layout, else a new one.
  absl::StatusOr<RoundFold> StartFold(std::vector<std::string> ids);
  // Moves round_'s fold, if any, to spent_fold_.
  void SpendFold();
  void SendError(uint64_t round, const absl::Status& status);
  void Send(const coordinator::v1::PeerMessage& message);

  const ModeRunnerDeps deps_;
  const DecentralizedRunnerOptions options_;
  const aggregation::Strategy strategy_;  // the task's aggregation
  UpdatePrivacy noise_;                   // privacy.dp at level peer (worker thread only)
  const bool secure_;                     // privacy.secure_aggregation
  const std::string task_;
  training::Trainer& trainer_;
  SnapshotStore& snapshots_;
  PeerClient& peers_;
  PeerMetrics& metrics_;
  const Clock& clock_;
  rpc::Wakeup& wakeup_;

  // Worker thread only.
  // The averaged (or synced, or initial) model of model_round_; never null. Shared with the
  // GLOBAL snapshot it is served as and with a pending evaluation, not copied.
  std::shared_ptr<const tensor::FlatModel> held_ = std::make_shared<const tensor::FlatModel>();
  uint64_t model_round_ = 0;
  bool params_are_held_ = false;                             // the trainer's parameters equal held_
  std::vector<coordinator::v1::PeerEndpoint> participants_;  // of the latest PeerList
  std::optional<RoundState> round_;
  // The fold of a round that no longer needs it, whose buffers the next round's fold takes over
  // (StartFold).
  std::optional<RoundFold> spent_fold_;
  // The round before's fetches: their models' bytes over their time (bytes/s; 0 = none yet).
  double fetch_rate_ = 0;
  // Model-sized storage used before, so that a round touches no fresh pages: fetched updates are
  // decoded into it, the trained parameters read into it and the aggregate written into it;
  // each comes back when its last reference goes (an update once folded, the round's own update
  // once the next one is published, a held model once no snapshot or round keeps it). Keeps as
  // many as are idle at once in a round: fetch_window in flight and the one folding, and one
  // handed back by the round before. Any thread: the fetches decode into it.
  const std::shared_ptr<tensor::BufferPool> model_buffers_;
  tensor::Compressor compressor_;  // the task's compression; top-k's residual
  KeptModel kept_;                 // the last completed round's model on disk (--state-dir)
  struct PendingEval {
    uint64_t round = 0;
    uint64_t version = 0;
    std::shared_ptr<const tensor::FlatModel> model;
  };
  std::optional<PendingEval> pending_eval_;  // evaluated right after the next JoinRound

  // The round and offer of the latest RoundOpen received, in the session's order (written by
  // Intercept on the reader thread, read there and by the worker).
  mutable absl::Mutex offer_mu_;
  uint64_t offered_round_ ABSL_GUARDED_BY(offer_mu_) = 0;
  uint64_t offered_offer_ ABSL_GUARDED_BY(offer_mu_) = 0;
};

// The registry's factory (mode_registry.cc): DecentralizedRunner::Create with default options.
absl::StatusOr<std::unique_ptr<ModeRunner>> CreateDecentralizedRunner(ModeRunnerDeps deps);

}  // namespace shoal::peer
