#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/modes/decentralized/decentralized_round.h"
#include "services/coordinator/round_budget.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// The coordinator side of a decentralized task (mode: decentralized): no aggregator; the
// coordinator only orchestrates rounds and model syncs, peers exchange weights directly.
//
// Per peer: unknown until its ModelHeld, then synced at a completed round, or syncing (a provider
// that holds the last completed round serves it its GLOBAL snapshot: SyncServe + SyncFrom).
// Round r = completed + 1 runs JOINING (RoundOpen to synced peers, JoinRound, first RoundReady
// closes joins) -> TRAINING (waiting for every joiner's RoundReady, ready deadline) ->
// CONNECTING (PeerList, ConnectionsReport, retries up to max_connection_retry, then blame and
// ConnectionFailed) -> SHARING (StartSharing, SharingDone with digests) -> complete
// (RoundSummary, ModelPublished). Too few ready peers -> Waiting and joins re-open for the same
// round. After the last round: EVALUATING until every participant's EvalReport (or a timeout).
// The protocol is documented in docs/explanation/decentralized.md and
// protos/shoal/coordinator/v1/session.proto.
//
// Connecting and sharing are bounded by round_deadline_seconds too: a participant that does not
// report in time is removed from the round with ConnectionFailed. A removed peer is synced after
// the round and sits out the next 1, 2, 4, ... (at most 16) rounds after consecutive removals,
// unless it is needed to reach min_participants, so that a peer nobody can reach does not cost
// every round max_connection_retry retries.
//
// With privacy.secure_aggregation the PeerList carries each participant's identity and signed
// mask keys, and SHARING has three steps: MaskedUpdatesHeld from every participant -> Unmask (the
// survivors, fixed for good) -> MaskReveal from every survivor -> MaskReveals -> SharingDone. A
// survivor lost between Unmask and MaskReveals restarts the round (JoinRefused, joins re-open).
//
// Owned by CoordinatorCore (one per task). Not thread-safe: driven under the core's lock.
class DecentralizedTask final : public ModeTask {
 public:
  // `status` may come from the task store after a coordinator restart: the completed rounds are
  // taken from model_version and the history; peers re-announce the round they hold.
  DecentralizedTask(const v1::TaskStatus& status, CoordinatorMetrics& metrics,
                    absl::Duration final_eval_timeout = absl::Seconds(60));

  void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
               ModeEffects& fx) override;
  void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                  v1::TaskStatus& status, ModeEffects& fx) override;
  absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message, absl::Time now,
                         v1::TaskStatus& status, ModeEffects& fx) override;
  void Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) override;

 private:
  enum class Stage { kIdle, kJoining, kTraining, kConnecting, kSharing, kEvaluating, kDone };
  enum class Model { kUnknown, kNeedsSync, kSyncing, kSynced };
  struct PeerState {
    std::string address;
    std::string identity_public_key;  // Hello's (secure aggregation)
    Model model = Model::kUnknown;
    uint64_t model_round = 0;
    // Removals for failing to connect in a row: the peer sits out rounds up to
    // `sit_out_until` (1, 2, 4, ... up to 16 rounds) unless it is needed to reach
    // min_participants. Reset when it completes a round.
    uint32_t strikes = 0;
    uint64_t sit_out_until = 0;
  };
  struct Sync {
    std::string provider;
    uint64_t round = 0;
    absl::Time started;
    absl::Time deadline;
    std::set<std::string> failed;  // providers that failed this joiner
    // When every provider has failed, the time they may all be tried again.
    absl::Time retry_at = absl::InfinitePast();
  };
  static constexpr absl::Duration kSyncRetryPause = absl::Seconds(1);
  using Ready = DecentralizedRound::Ready;
  using Done = DecentralizedRound::Done;
  using Round = DecentralizedRound;

  // Shared tail of every entry point: rewrites the status fields this task owns and sets
  // fx.changed when anything differs from `before`.
  void Publish(const std::string& before, v1::TaskStatus& status, ModeEffects& fx);

  absl::Status OnModelHeld(const std::string& id, const v1::ModelHeld& m, absl::Time now,
                           ModeEffects& fx);
  absl::Status OnJoinRound(const std::string& id, const v1::JoinRound& m, ModeEffects& fx);
  absl::Status OnRoundReady(const std::string& id, const v1::RoundReady& m, absl::Time now,
                            ModeEffects& fx);
  absl::Status OnConnectionsReport(const std::string& id, const v1::ConnectionsReport& m,
                                   absl::Time now, ModeEffects& fx);
  absl::Status OnSharingDone(const std::string& id, const v1::SharingDone& m, absl::Time now,
                             ModeEffects& fx);
  // Secure aggregation (decentralized_sharing.cc).
  absl::Status OnMaskedUpdatesHeld(const std::string& id, const v1::MaskedUpdatesHeld& m,
                                   ModeEffects& fx);
  absl::Status OnMaskReveal(const std::string& id, const v1::MaskReveal& m, ModeEffects& fx);
  // A RoundReady of a secure round carries a mask key, and its peer has an identity key.
  absl::Status CheckMaskKey(const std::string& id, const v1::RoundReady& m);
  // While SHARING: `id` has not done the current step (secure: held, revealed, then done).
  bool HoldsUpSharing(const std::string& id) const;
  // A participant is gone after the survivors were fixed: its seeds cannot be had, so nobody
  // can finish the round; every participant leaves it (JoinRefused) and joins open again.
  void RestartSecureRound(const std::string& why, absl::Time now, ModeEffects& fx);
  absl::Status OnSyncDone(const std::string& id, const v1::SyncDone& m, absl::Time now,
                          ModeEffects& fx);
  absl::Status OnEvalReport(const std::string& id, const v1::EvalReport& m, ModeEffects& fx);

  // Model sync of `id` to the last completed round (a new provider, excluding failed ones).
  void StartSync(const std::string& id, absl::Time now, ModeEffects& fx);
  void FailSync(const std::string& id, const std::string& why, absl::Time now, ModeEffects& fx);
  void MarkSynced(const std::string& id, uint64_t round, absl::Time now, ModeEffects& fx);
  // After a coordinator restart, before this coordinator opened a round: `id` holds the round
  // after the last one the store knows of, so the peers completed it and the record was lost
  // with the old coordinator. Takes that round as completed (its digest the round's model).
  void AdoptRoundCompletedBeforeRestart(const std::string& id, const v1::ModelHeld& m,
                                        absl::Time now, ModeEffects& fx);
  // Opens the next round when enough peers are synced (and privacy.dp's budget allows it);
  // otherwise tells everyone to wait. Every entry point calls it last, before Publish.
  void MaybeOpen(absl::Time now, v1::TaskStatus& status, ModeEffects& fx);
  // privacy.dp: whether the next round may open for `offer`, charging it to the budget when it
  // may; else the task waits for data reports, or evaluates its last model and completes (the
  // budget is spent), or fails (a corrupt accountant).
  bool WithinBudget(const std::set<std::string>& offer, absl::Time now, v1::TaskStatus& status,
                    ModeEffects& fx);
  // The task completes: "completed N rounds", or why the budget ended it early.
  void Finish(ModeEffects& fx);
  void Offer(const std::string& id, absl::Time now, ModeEffects& fx);
  bool SitsOut(const std::string& id) const;
  // Joins closed: proceeds when every joiner is ready (or gone).
  void CheckAllReady(absl::Time now, ModeEffects& fx);
  void Reopen(absl::Time now, ModeEffects& fx);
  void StartConnecting(absl::Time now, ModeEffects& fx);
  void SendPeerLists(bool sharing, absl::Time now, ModeEffects& fx);
  void CheckReports(absl::Time now, ModeEffects& fx);
  // Takes `ids` out of the round with ConnectionFailed, then continues with the rest.
  void RemoveFromRound(const std::set<std::string>& ids, const std::string& reason, absl::Time now,
                       ModeEffects& fx);
  // After participants changed in CONNECTING/SHARING: a new PeerList, or wait if too few.
  void ContinueWithParticipants(absl::Time now, ModeEffects& fx);
  void CheckSharingDone(absl::Time now, ModeEffects& fx);
  void CompleteRound(absl::Time now, ModeEffects& fx);
  // A peer of the round is gone (left, crashed, restarted): drops it from every round set.
  void DropFromRound(const std::string& id, absl::Time now, ModeEffects& fx);
  bool InRound(const std::string& id) const;
  void SendWaiting(const std::set<std::string>& to, size_t have, ModeEffects& fx);
  std::set<std::string> SyncedAtCompleted() const;
  // Fails the task once peers have needed round completed_'s model for kLostModelAfter (at least
  // three round deadlines) while no present peer held it: every holder left with it (a killed
  // peer starts again without its model), and nothing else can make it.
  void FailIfModelLost(absl::Time now, ModeEffects& fx);
  std::string PeerStateName(const std::string& id, const PeerState& p) const;

  const std::string task_;
  const common::v1::TaskSpec spec_;
  CoordinatorMetrics& metrics_;
  const absl::Duration final_eval_timeout_;
  const absl::Duration round_deadline_;
  const uint32_t max_retry_;
  const bool secure_;   // privacy.secure_aggregation
  RoundBudget budget_;  // privacy.dp

  uint64_t completed_ = 0;
  uint64_t completed_digest_ = 0;  // of round completed_'s model (0 = unknown)
  Stage stage_ = Stage::kIdle;
  std::map<std::string, PeerState> peers_;
  std::map<std::string, Sync> syncs_;  // joiner -> its sync in flight
  Round round_;
  uint64_t last_offer_ = 0;  // RoundOpen.offer of the last RoundOpen sent
  std::set<std::string> eval_pending_;
  absl::Time eval_deadline_ = absl::InfiniteFuture();
  std::string waiting_notice_;  // last Waiting sent while idle, to avoid repeats
  std::string message_;
  std::string final_message_;  // the task completes with it (the privacy budget is spent)
  // Since when peers have needed round completed_'s model with no present peer holding it.
  std::optional<absl::Time> model_unheld_since_;
  std::set<std::string> last_holders_;  // the peers that held round completed_'s model last
  bool finished_ = false;
};

// The mode registry's factory (services/coordinator/mode_registry.cc).
std::unique_ptr<ModeTask> MakeDecentralizedTask(const v1::TaskStatus& status,
                                                const ModeOptions& options,
                                                CoordinatorMetrics& metrics);

}  // namespace shoal::coordinator
