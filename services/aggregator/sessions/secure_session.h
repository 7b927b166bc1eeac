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
#include "libs/privacy/fixed_point.h"
#include "services/aggregator/sessions/secure_exchange.h"
#include "services/aggregator/sessions/session.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::aggregator {

// A federated-sync round with secure aggregation (OpenRoundRequest.secure_aggregation): the
// expected peers take part in one SecAgg+ round (libs/privacy/secagg/round.h) over their
// SecureAggregate streams instead of pushing, and CloseRound publishes base + the survivors' sum /
// the survivors (libs/privacy/secagg/update_codec.h). The aggregator relays the sealed shares
// unread and sees only masked updates and the sum. With peer-level DP (OpenRoundRequest.dp) it
// publishes base + (sum + noise) / the expected peers instead (round_privacy.h, PrivateMeanOfSum):
// the noise of the peers that dropped out (distributed noise) or all of it (central noise).
// On a tree (OpenRoundRequest.parent) the round is one cluster's: CloseRound closes it into the
// survivors' sum, each update weighing 1, which goes to the parent as the cluster's partial sum
// (ClosePartial); the parent's plain round takes it like any child's.
//
// The protocol runs in a SecureExchange (secure_exchange.h, its steps and their deadlines).
// CloseRound waits for its steps and publishes; when the dropouts leave fewer than the threshold,
// the round fails with FAILED_PRECONDITION, publishes nothing, and may be opened again (same
// number) to run again.
// Replicas (a cluster's backup, OpenRoundParams.standby_for): a primary copies nothing (a masked
// update is of no use without the round's own unmasking), so a backup's round is a standby that
// holds the base version and takes no stream (UNAVAILABLE, as a plain standby refuses a peer's
// push). Opened again without standby_for (promoted: the primary was lost), it starts the secure
// round from its first step: a new graph seed, and peers that join make fresh keys and masks;
// nothing of the primary's run reaches it, so it learns what the primary could, the survivors'
// sum, and no more (secure_restarts_total, and a log line, count it).
class SecureRoundSession final : public AggregationSession {
 public:
  // Checks the settings (INVALID_ARGUMENT naming the field) and what secure aggregation cannot do.
  static absl::StatusOr<std::shared_ptr<SecureRoundSession>> Make(const OpenRoundParams& params,
                                                                  SessionHost& host);

  absl::StatusOr<std::shared_ptr<AggregationSession>> Open(
      TaskState& task, const std::shared_ptr<AggregationSession>& current) override;
  absl::Status CheckReplaceable(const TaskState& task) const override;
  void Abandon() override;
  std::shared_ptr<AggregationSession> OnNewVersion(TaskState& task) override;
  absl::Status Target(TaskState& task, const PushMeta& meta, PushTarget& target) override;
  void StartPushing(const std::string&) override {}
  void StopPushing(const std::string&) override {}
  Acceptance Accept(TaskState& task, PushedUpdate& update) override;
  void Fold(const std::shared_ptr<TaskState>&, PushedUpdate&) override {}
  absl::StatusOr<RoundResult> Close(TaskState& task, uint64_t round) override;
  absl::StatusOr<std::shared_ptr<const PartialResult>> ClosePartial(TaskState& task,
                                                                    uint64_t round) override;
  absl::StatusOr<bool> AddPartial(const std::shared_ptr<TaskState>& task, const PartialMeta& meta,
                                  const aggregation::PartialSum& partial) override;
  absl::StatusOr<size_t> PartialValues(const TaskState& task, uint64_t round) const override;
  v1::ParentRound ParentOf(uint64_t round) const override;
  void Describe(v1::WatchStarted& started) const override;
  absl::StatusOr<std::shared_ptr<SecureExchange>> Secure(const TaskState& task,
                                                         uint64_t round) override;

 private:
  enum class State { kOpen, kClosing, kClosed, kFailed, kAbandoned };
  // Closed rounds' results, shared from one secure round of the task to the next (a repeated
  // CloseRound gets the same answer).
  using History = std::map<uint64_t, RoundResult>;

  SecureRoundSession(SessionHost& host, const OpenRoundParams& params, uint32_t threshold,
                     uint32_t neighbourhood, uint32_t step_timeout_ms);
  std::string Label() const;
  // What Close publishes from the survivors' ring sum (after Open), into `out`.
  absl::Status MeanOf(const SecureExchange::Outcome& outcome, std::vector<float>& out) const;

  // Under the host's mu(): a standby promoted by this open (`current` was this round's standby).
  bool Promotes(const SecureRoundSession& current) const;

  SessionHost& host_;
  const std::string task_;
  const uint64_t number_;
  const uint64_t base_version_;
  const std::vector<std::string> expected_;
  const double clip_norm_;
  // Level peer, or unset (no DP).
  const common::v1::DpSpec dp_;
  // The round's peers (DpRoundPeers): the fixed denominator and what sizes their noise shares.
  const size_t dp_round_peers_;
  // On a tree (a cluster's node): where the cluster's sum goes (ClosePartial); else empty.
  const v1::ParentRound parent_;
  const uint32_t threshold_;
  const uint32_t neighbourhood_;
  const absl::Duration step_timeout_;
  const std::map<std::string, std::string> identity_keys_;

  // Guarded by the host's mu(); exchange_, codec_ and base_ are set by Open and never change
  // after.
  State state_ = State::kOpen;
  // Replicas: the primary's child id while this is its backup's standby (no exchange); "" once
  // promoted, or for a primary.
  std::string standby_for_;
  std::shared_ptr<const tensor::FlatModel> base_;
  std::shared_ptr<SecureExchange> exchange_;
  std::optional<privacy::FixedPointCodec> codec_;
  std::shared_ptr<History> history_;
  std::shared_ptr<const PartialResult> partial_;  // on a tree, once closed
  // Once closed: the round's ring sum, whose memory the task's next secure round sums into.
  std::vector<uint32_t> spare_sum_;
  absl::Time opened_at_;
};

}  // namespace shoal::aggregator
