#pragma once

#include <cstddef>
#include <cstdint>
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
#include "libs/aggregation/strategy.h"
#include "services/aggregator/round_aggregation.h"
#include "services/aggregator/sessions/partial_sums.h"
#include "services/aggregator/sessions/session.h"

namespace shoal::aggregator {

// A federated-sync round (OpenRound .. CloseRound): the expected peers' updates (and the
// stragglers' late ones) are folded into the round's aggregation as they are accepted (mean:
// a running sum; the other strategies keep them) and CloseRound publishes base + aggregate as
// the next version, with differential privacy's noise and fixed denominator when the round asks
// for it (round_privacy.h). In a tree, the round takes its children's partial sums
// (AddPartial), and a child's round closes into a partial sum for its parent (ClosePartial);
// TreePartials (partial_sums.h) decides which sums enter and keeps the child's.
// Replicas: a primary's round copies accepted updates to its backups; a backup's round is a
// standby that takes only those copies until it is opened again without standby_for.
// Each round is one session; the task's next round takes over the closed rounds' results and
// the stragglers' last rounds (History), and the aggregation's buffers when it fits.
class RoundSession final : public AggregationSession {
 public:
  enum class State { kOpen, kClosing, kClosed, kAbandoned };

  // Checks what needs no task (INVALID_ARGUMENT) and makes the strategy.
  static absl::StatusOr<std::shared_ptr<RoundSession>> Make(const OpenRoundParams& params,
                                                            SessionHost& host);

  absl::StatusOr<std::shared_ptr<AggregationSession>> Open(
      TaskState& task, const std::shared_ptr<AggregationSession>& current) override;
  absl::Status CheckReplaceable(const TaskState& task) const override;
  void Abandon() override;
  std::shared_ptr<AggregationSession> OnNewVersion(TaskState& task) override;
  absl::Status Target(TaskState& task, const PushMeta& meta, PushTarget& target) override;
  void StartPushing(const std::string& peer) override { pushing_.insert(peer); }
  void StopPushing(const std::string& peer) override { pushing_.erase(peer); }
  Acceptance Accept(TaskState& task, PushedUpdate& update) override;
  void Fold(const std::shared_ptr<TaskState>& task, PushedUpdate& update) override;
  absl::StatusOr<RoundResult> Close(TaskState& task, uint64_t round) override;
  absl::StatusOr<std::shared_ptr<const PartialResult>> ClosePartial(TaskState& task,
                                                                    uint64_t round) override;
  absl::StatusOr<bool> AddPartial(const std::shared_ptr<TaskState>& task, const PartialMeta& meta,
                                  const aggregation::PartialSum& partial) override;
  absl::StatusOr<size_t> PartialValues(const TaskState& task, uint64_t round) const override;
  v1::ParentRound ParentOf(uint64_t round) const override;
  void Describe(v1::WatchStarted& started) const override;

 private:
  // What a task's rounds share from one round to the next.
  struct History {
    std::map<uint64_t, RoundResult> closed;  // results of recently closed rounds
    // Stragglers: the UpdateMeta.round of each one's last accepted late update (a repeat of
    // it, into whatever round, is a duplicate).
    std::map<std::string, uint64_t> late_rounds;
  };

  RoundSession(SessionHost& host, OpenRoundParams params, aggregation::Strategy strategy,
               std::set<std::string> expected, std::set<std::string> late, TreePartials tree,
               common::v1::AsyncSpec late_staleness);

  const char* StateName() const;
  // Takes the request's peers, children, parent, replicas and bounds (an open or a re-open).
  void TakeMembers(TaskState& task, const RoundSession& request);
  // Under mu(): a straggler's late update goes into this (open) round.
  absl::Status TargetLate(TaskState& task, const PushMeta& meta, PushTarget& target);
  // Under mu(): a primary's copy needs a round that is (or was) its backup; a peer's own push,
  // a round that is not a standby.
  absl::Status CheckReplica(const PushMeta& meta, PushTarget& target) const;
  // Under mu(): CloseRound's and ClosePartial's first step: marks the round closing and waits
  // until no fold is in flight. INTERNAL (the round abandoned) when an accepted update's fold
  // failed.
  absl::Status FinishFolds(const std::string& label);
  // Under mu(): waits while another close is applying this round.
  void AwaitClosing();

  SessionHost& host_;
  // Fields are guarded by host_.mu(), except `aggregation_`, which folds touch under
  // `fold_mu_` while the round is open and a close owns once it is kClosing with no fold in
  // flight.
  uint64_t number_ = 0;
  uint64_t base_version_ = 0;
  std::shared_ptr<const tensor::FlatModel> base_;
  std::set<std::string> expected_;
  std::set<std::string> late_;  // stragglers: one late update each
  // Tree rounds: the children's partial sums in; a child's round: its parent and its sum.
  TreePartials tree_;
  // Replicas: a primary's backups (it copies each accepted update there before answering);
  // on a backup, the primary's child id (kept once promoted: its copies in flight still count)
  // and whether it is still a standby (takes only the primary's copies).
  std::vector<std::string> backups_;
  std::string replica_id_;  // what a primary's copies carry as replicated_by
  std::string primary_;
  bool standby_ = false;
  common::v1::AsyncSpec late_staleness_;  // the stragglers' staleness bound and weighting
  double max_norm_ = 0;
  // Differential privacy (round_privacy.h): level unspecified for none; dp_expected_ is the
  // fixed denominator, the peers expected at the open (on a tree: in the whole round,
  // DpRoundPeers). Only a round without a parent adds noise (Close); a child's sends its sum.
  common::v1::DpSpec dp_;
  size_t dp_expected_ = 0;
  aggregation::Strategy strategy_;
  State state_ = State::kOpen;
  std::set<std::string> accepted_;  // peers whose updates were accepted
  std::set<std::string> pushing_;   // peers with a push in progress
  int folds_in_flight_ = 0;         // accepted updates whose fold has not finished
  absl::Status fold_error_;  // first failed fold (an invariant broke); the round cannot close
  uint64_t num_samples_ = 0;
  double loss_sum_ = 0;  // sum of train_loss * num_samples
  absl::Time opened_at_;
  std::shared_ptr<History> history_;

  absl::Mutex fold_mu_;
  std::unique_ptr<RoundAggregation> aggregation_;
};

}  // namespace shoal::aggregator
