#include "services/coordinator/modes/decentralized/decentralized_task.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "libs/task/task_privacy.h"
#include "services/coordinator/round_budget.h"
#include "services/coordinator/round_lists.h"

namespace shoal::coordinator {
namespace {

constexpr uint32_t kDefaultMaxConnectionRetry = 3;

}  // namespace

DecentralizedTask::DecentralizedTask(const v1::TaskStatus& status, CoordinatorMetrics& metrics,
                                     absl::Duration final_eval_timeout)
    : task_(status.spec().name()),
      spec_(status.spec()),
      metrics_(metrics),
      final_eval_timeout_(final_eval_timeout),
      round_deadline_(absl::Seconds(std::max<uint32_t>(1, status.spec().round_deadline_seconds()))),
      max_retry_(status.spec().has_max_connection_retry() ? status.spec().max_connection_retry()
                                                          : kDefaultMaxConnectionRetry),
      secure_(task::HasSecureAggregation(status.spec())),
      budget_(task_, spec_, metrics),
      completed_(CompletedRounds(status)) {
  for (const v1::RoundSummary& r : status.history()) {
    if (r.round() == completed_) completed_digest_ = r.model_digest();
  }
  if (completed_ > 0) {
    message_ = absl::StrCat("resuming after round ", completed_,
                            ": waiting for peers that hold its model");
  }
  if (completed_ >= spec_.rounds()) {
    // The coordinator restarted while the final model was evaluated: nothing left to wait for.
    stage_ = Stage::kEvaluating;
    eval_deadline_ = absl::InfinitePast();
  }
}

// --- Entry points --------------------------------------------------------------------------

void DecentralizedTask::AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
                                ModeEffects& fx) {
  const std::string before = status.SerializeAsString();
  if (peers_.count(peer.id)) DropFromRound(peer.id, now, fx);
  PeerState& p = peers_[peer.id];
  p = PeerState{};
  p.address = peer.address;
  p.identity_public_key = peer.identity_public_key;
  syncs_.erase(peer.id);
  // It announces the round it holds with ModelHeld; until then it counts for nothing.
  MaybeOpen(now, status, fx);
  Publish(before, status, fx);
}

void DecentralizedTask::RemovePeer(const std::string& peer_id, const std::string& why,
                                   absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  const std::string before = status.SerializeAsString();
  if (peers_.count(peer_id) == 0) return;
  LogInfo("task ", task_, ": peer ", peer_id, " left (", why, ")");
  DropFromRound(peer_id, now, fx);
  peers_.erase(peer_id);
  syncs_.erase(peer_id);
  // Joiners it was serving get another provider.
  std::vector<std::string> orphans;
  for (const auto& [joiner, sync] : syncs_) {
    if (sync.provider == peer_id) orphans.push_back(joiner);
  }
  for (const std::string& joiner : orphans) {
    FailSync(joiner, absl::StrCat("provider ", peer_id, " left"), now, fx);
  }
  if (stage_ == Stage::kEvaluating && eval_pending_.erase(peer_id) && eval_pending_.empty() &&
      !finished_) {
    Finish(fx);
  }
  MaybeOpen(now, status, fx);
  Publish(before, status, fx);
}

absl::Status DecentralizedTask::OnMessage(const std::string& peer_id,
                                          const v1::PeerMessage& message, absl::Time now,
                                          v1::TaskStatus& status, ModeEffects& fx) {
  const std::string before = status.SerializeAsString();
  if (peers_.count(peer_id) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", peer_id, " is not a member of task ", task_));
  }
  absl::Status result;
  switch (message.kind_case()) {
    case v1::PeerMessage::kModelHeld:
      result = OnModelHeld(peer_id, message.model_held(), now, fx);
      break;
    case v1::PeerMessage::kJoinRound:
      result = OnJoinRound(peer_id, message.join_round(), fx);
      break;
    case v1::PeerMessage::kRoundReady:
      result = OnRoundReady(peer_id, message.round_ready(), now, fx);
      break;
    case v1::PeerMessage::kConnectionsReport:
      result = OnConnectionsReport(peer_id, message.connections_report(), now, fx);
      break;
    case v1::PeerMessage::kSharingDone:
      result = OnSharingDone(peer_id, message.sharing_done(), now, fx);
      break;
    case v1::PeerMessage::kMaskedUpdatesHeld:
      result = OnMaskedUpdatesHeld(peer_id, message.masked_updates_held(), fx);
      break;
    case v1::PeerMessage::kMaskReveal:
      result = OnMaskReveal(peer_id, message.mask_reveal(), fx);
      break;
    case v1::PeerMessage::kSyncDone:
      result = OnSyncDone(peer_id, message.sync_done(), now, fx);
      break;
    case v1::PeerMessage::kEvalReport:
      result = OnEvalReport(peer_id, message.eval_report(), fx);
      break;
    default:
      result = absl::InvalidArgumentError(absl::StrCat("message kind ",
                                                       static_cast<int>(message.kind_case()),
                                                       " does not belong to a decentralized task"));
      break;
  }
  MaybeOpen(now, status, fx);
  Publish(before, status, fx);
  return result;
}

void DecentralizedTask::Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  const std::string before = status.SerializeAsString();
  // Model syncs that take too long get another provider; joiners without one try again.
  std::vector<std::string> late;
  for (const auto& [joiner, sync] : syncs_) {
    if (!sync.provider.empty() && now >= sync.deadline) late.push_back(joiner);
  }
  for (const std::string& joiner : late) FailSync(joiner, "sync timed out", now, fx);
  for (const auto& [id, p] : peers_) {
    if (p.model == Model::kNeedsSync && stage_ != Stage::kEvaluating && stage_ != Stage::kDone) {
      StartSync(id, now, fx);
    }
  }
  FailIfModelLost(now, fx);
  if (finished_) {
    Publish(before, status, fx);
    return;
  }

  switch (stage_) {
    case Stage::kJoining:
    case Stage::kTraining: {
      std::vector<std::string> missed;
      for (const auto& [id, deadline] : round_.joined) {
        if (!round_.ready.count(id) && now >= deadline) missed.push_back(id);
      }
      for (const std::string& id : missed) {
        LogWarning("task ", task_, ": peer ", id, " missed the ready deadline of round ",
                   round_.number);
        round_.joined.erase(id);
        round_.dropped.insert(id);
        v1::CoordinatorEvent e;
        e.mutable_join_refused()->set_round(round_.number);
        e.mutable_join_refused()->set_reason("missed the ready deadline");
        fx.Send(id, std::move(e));
      }
      if (!missed.empty() && stage_ == Stage::kJoining && round_.joined.empty()) {
        // Every peer that joined missed its deadline before one was ready: joins are still
        // open, but nobody is offered the round any more; offer it again.
        Reopen(now, fx);
      } else if (!missed.empty()) {
        CheckAllReady(now, fx);
      }
      break;
    }
    case Stage::kConnecting:
      if (now >= round_.stage_deadline) {
        std::set<std::string> silent;
        for (const std::string& id : round_.participants) {
          if (!round_.reports.count(id)) silent.insert(id);
        }
        RemoveFromRound(silent, "did not report its connections in time", now, fx);
      }
      break;
    case Stage::kSharing:
      if (now >= round_.stage_deadline) {
        std::set<std::string> silent;
        for (const std::string& id : round_.participants) {
          if (HoldsUpSharing(id)) silent.insert(id);
        }
        RemoveFromRound(silent, "did not finish sharing in time", now, fx);
      }
      break;
    case Stage::kEvaluating:
      if (!finished_ && (eval_pending_.empty() || now >= eval_deadline_)) {
        if (!eval_pending_.empty()) {
          LogWarning("task ", task_, ": final evaluation timed out waiting for ",
                     absl::StrJoin(eval_pending_, ", "));
        }
        Finish(fx);
      }
      break;
    default:
      break;
  }
  MaybeOpen(now, status, fx);
  Publish(before, status, fx);
}

// --- Messages --------------------------------------------------------------------------------

absl::Status DecentralizedTask::OnJoinRound(const std::string& id, const v1::JoinRound& m,
                                            ModeEffects& fx) {
  const PeerState& p = peers_[id];
  const bool ok = (stage_ == Stage::kJoining && round_.joins_open) && m.round() == round_.number &&
                  p.model == Model::kSynced && p.model_round + 1 == round_.number &&
                  !round_.excluded.count(id);
  if (round_.joined.count(id) && m.round() == round_.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", id, " joined round ", m.round(), " already"));
  }
  if (!ok) {
    // It started training on its JoinRound: tell it to restore its model.
    const std::string reason =
        m.round() != round_.number || stage_ == Stage::kIdle
            ? absl::StrCat("round ", m.round(), " is not open")
        : stage_ == Stage::kJoining || stage_ == Stage::kTraining
            ? (p.model == Model::kSynced && p.model_round + 1 == round_.number &&
                       !round_.excluded.count(id)
                   ? "joins closed at the first ready; wait for the next round"
                   : "the peer does not hold the previous round's model")
            : "the round is past joining";
    v1::CoordinatorEvent e;
    e.mutable_join_refused()->set_round(m.round());
    e.mutable_join_refused()->set_reason(reason);
    e.mutable_join_refused()->set_offer(m.offer());  // an answer to a later offer stands
    fx.Send(id, std::move(e));
    return absl::OkStatus();
  }
  auto offered = round_.offered.find(id);
  round_.joined[id] =
      offered != round_.offered.end() ? offered->second : round_.opened + round_deadline_;
  round_.dropped.erase(id);
  ++round_.joins;
  metrics_.decentralized.joins.Increment();
  return absl::OkStatus();
}

absl::Status DecentralizedTask::OnRoundReady(const std::string& id, const v1::RoundReady& m,
                                             absl::Time now, ModeEffects& fx) {
  if ((stage_ != Stage::kJoining && stage_ != Stage::kTraining) || m.round() != round_.number ||
      !round_.joined.count(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("ready for round ", m.round(), " is not expected"));
  }
  if (round_.ready.count(id)) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", id, " is ready already"));
  }
  if (absl::Status s = CheckMaskKey(id, m); !s.ok()) return s;
  round_.ready[id] =
      Ready{m.num_samples(), m.train_loss(), m.mask_public_key(), m.mask_key_signature()};
  if (!round_.first_ready) round_.first_ready = now;
  if (round_.joins_open) {
    round_.joins_open = false;  // joins close at the first ready
    stage_ = Stage::kTraining;
  }
  CheckAllReady(now, fx);
  return absl::OkStatus();
}

absl::Status DecentralizedTask::OnEvalReport(const std::string& id, const v1::EvalReport& m,
                                             ModeEffects& fx) {
  if (stage_ != Stage::kEvaluating || m.version() != completed_) return absl::OkStatus();
  if (eval_pending_.erase(id) && eval_pending_.empty() && !finished_) {
    Finish(fx);
  }
  return absl::OkStatus();
}

// --- Rounds ----------------------------------------------------------------------------------

void DecentralizedTask::SendWaiting(const std::set<std::string>& to, size_t have, ModeEffects& fx) {
  v1::CoordinatorEvent e;
  e.mutable_waiting()->set_have(static_cast<uint32_t>(have));
  e.mutable_waiting()->set_need(spec_.min_participants());
  for (const std::string& id : to) fx.Send(id, e);
}

void DecentralizedTask::MaybeOpen(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  if (stage_ != Stage::kIdle || finished_ || completed_ >= spec_.rounds()) return;
  const std::set<std::string> synced = SyncedAtCompleted();
  if (synced.size() < std::max<uint32_t>(1, spec_.min_participants())) {
    const std::string notice =
        absl::StrCat("waiting for peers holding round ", completed_, ": have ", synced.size(),
                     ", need ", std::max<uint32_t>(1, spec_.min_participants()));
    std::set<std::string> known;
    for (const auto& [id, p] : peers_) {
      if (p.model != Model::kUnknown) known.insert(id);
    }
    // Sent again when the numbers or the peers that know the task change.
    const std::string key = absl::StrCat(notice, " to ", absl::StrJoin(known, ","));
    if (key != waiting_notice_) {
      SendWaiting(known, synced.size(), fx);
      waiting_notice_ = key;
    }
    message_ = notice;
    return;
  }
  waiting_notice_.clear();
  // Peers that kept failing to connect sit out, as long as enough others are here.
  std::set<std::string> offer;
  for (const std::string& id : synced) {
    if (!SitsOut(id)) offer.insert(id);
  }
  if (offer.size() < std::max<uint32_t>(1, spec_.min_participants())) offer = synced;
  if (!WithinBudget(offer, now, status, fx)) return;
  round_ = Round{};
  round_.number = completed_ + 1;
  round_.opened = now;
  round_.joins_open = true;
  stage_ = Stage::kJoining;
  LogInfo("task ", task_, ": round ", round_.number, " open for ", synced.size(), " peers");
  for (const std::string& id : synced) {
    if (!offer.count(id)) {
      LogInfo("task ", task_, ": peer ", id, " sits out round ", round_.number,
              " after failing to connect");
    }
  }
  for (const std::string& id : offer) Offer(id, now, fx);
}

bool DecentralizedTask::SitsOut(const std::string& id) const {
  auto it = peers_.find(id);
  return it != peers_.end() && completed_ + 1 <= it->second.sit_out_until;  // the next round
}

bool DecentralizedTask::WithinBudget(const std::set<std::string>& offer, absl::Time now,
                                     v1::TaskStatus& status, ModeEffects& fx) {
  if (!budget_.enabled()) return true;
  budget_.Init(status);
  // Charged as it opens, before any peer trains for it (a round whose joins re-open is not
  // charged again: each peer trains once per round). Level peer at sampling rate 1: the
  // offered peers are its population (who sits out is no secret draw that could amplify).
  const uint64_t round = completed_ + 1;
  const RoundBudget::Decision decision = budget_.CheckAndCharge(
      status, std::vector<std::string>(offer.begin(), offer.end()), offer.size(), round);
  switch (decision.kind) {
    case RoundBudget::Decision::Kind::kOpen:
      return true;
    case RoundBudget::Decision::Kind::kWaitForData:
      message_ = absl::StrCat("round ", round, " waits for every peer's data report");
      return false;
    case RoundBudget::Decision::Kind::kFailed:
      finished_ = true;
      stage_ = Stage::kDone;
      fx.finish = {v1::TASK_STATE_FAILED, decision.message};
      return false;
    case RoundBudget::Decision::Kind::kSpent:
      // The peers that hold the last round's model evaluate it, as after the last round.
      final_message_ = decision.message;
      stage_ = Stage::kEvaluating;
      eval_pending_ = SyncedAtCompleted();
      eval_deadline_ = now + std::min(final_eval_timeout_, round_deadline_);
      return false;
  }
  return false;
}

void DecentralizedTask::Finish(ModeEffects& fx) {
  finished_ = true;
  stage_ = Stage::kDone;
  fx.finish = {v1::TASK_STATE_COMPLETED, final_message_.empty()
                                             ? absl::StrCat("completed ", completed_, " rounds")
                                             : final_message_};
}

void DecentralizedTask::Offer(const std::string& id, absl::Time now, ModeEffects& fx) {
  const absl::Time deadline = now + round_deadline_;
  round_.offered[id] = deadline;
  v1::CoordinatorEvent e;
  e.mutable_round_open()->set_round(round_.number);
  e.mutable_round_open()->set_round_batches(spec_.round_batches());
  e.mutable_round_open()->set_ready_deadline_unix_ms(absl::ToUnixMillis(deadline));
  e.mutable_round_open()->set_offer(++last_offer_);
  fx.Send(id, std::move(e));
}

void DecentralizedTask::CheckAllReady(absl::Time now, ModeEffects& fx) {
  if (stage_ != Stage::kTraining) return;  // joins still open (or past this step)
  for (const auto& [id, deadline] : round_.joined) {
    if (!round_.ready.count(id)) return;
  }
  if (round_.ready.size() < std::max<uint32_t>(1, spec_.min_participants())) {
    std::set<std::string> ready;
    for (const auto& [id, r] : round_.ready) ready.insert(id);
    SendWaiting(ready, ready.size(), fx);
    Reopen(now, fx);
    return;
  }
  StartConnecting(now, fx);
}

void DecentralizedTask::Reopen(absl::Time now, ModeEffects& fx) {
  // Too few participants: joining re-opens for the same round; the ready ones keep their update.
  stage_ = Stage::kJoining;
  round_.ReopenJoins();
  LogInfo("task ", task_, ": round ", round_.number, " has ", round_.ready.size(),
          " ready peers, needs ", spec_.min_participants(), ": joins re-open");
  for (const auto& [id, p] : peers_) {
    if (p.model == Model::kSynced && p.model_round + 1 == round_.number &&
        !round_.joined.count(id) && !round_.excluded.count(id)) {
      Offer(id, now, fx);
    }
  }
}

void DecentralizedTask::CompleteRound(absl::Time now, ModeEffects& fx) {
  const uint64_t r = round_.number;
  bool digests_differ = false;
  const v1::RoundSummary summary = round_.Summary(now, digests_differ);
  if (digests_differ) {
    LogWarning("task ", task_, ": round ", r, ": participants hold different averaged models");
    metrics_.decentralized.digest_mismatches.Increment();
  }
  const absl::Duration overhead = absl::Milliseconds(summary.overhead_ms());
  fx.rounds_completed.push_back(summary);
  metrics_.decentralized.round_participants.Set(static_cast<double>(round_.participants.size()));
  metrics_.decentralized.round_overhead.Observe(absl::ToDoubleSeconds(overhead));
  LogInfo("task ", task_, ": round ", r, " complete: ", round_.participants.size(),
          " participants, ", summary.num_samples(), " samples, loss ", summary.mean_train_loss(),
          ", overhead ", absl::FormatDuration(overhead));

  completed_ = r;
  completed_digest_ = summary.model_digest();
  v1::CoordinatorEvent published;
  published.mutable_model_published()->set_round(r);
  published.mutable_model_published()->set_version(r);
  const std::set<std::string> participants = round_.participants;
  for (const std::string& id : participants) {
    peers_[id].model_round = r;
    peers_[id].strikes = 0;
    fx.Send(id, published);
  }
  round_ = Round{};
  round_.number = r;
  if (r >= spec_.rounds()) {
    stage_ = Stage::kEvaluating;
    eval_pending_ = participants;
    eval_deadline_ = now + std::min(final_eval_timeout_, round_deadline_);
    return;
  }
  stage_ = Stage::kIdle;  // the entry point that got here opens the next round (MaybeOpen)
  // The others hold an older model now: they sync before they take part again.
  for (auto& [id, p] : peers_) {
    if (p.model == Model::kSynced && p.model_round < r) {
      p.model = Model::kNeedsSync;
      StartSync(id, now, fx);
    } else if (p.model == Model::kSyncing) {
      auto it = syncs_.find(id);
      if (it != syncs_.end() && it->second.round < r) {
        // Its provider is about to replace that model: sync it to the new round at once.
        syncs_.erase(it);
        p.model = Model::kNeedsSync;
        StartSync(id, now, fx);
      }
    }
  }
}

bool DecentralizedTask::InRound(const std::string& id) const {
  if (stage_ == Stage::kIdle || stage_ == Stage::kEvaluating || stage_ == Stage::kDone) {
    return false;
  }
  return round_.joined.count(id) || round_.ready.count(id) || round_.participants.count(id);
}

void DecentralizedTask::DropFromRound(const std::string& id, absl::Time now, ModeEffects& fx) {
  round_.offered.erase(id);
  if (!InRound(id)) return;
  ++round_.leaves;
  metrics_.decentralized.leaves.Increment();
  round_.joined.erase(id);
  round_.ready.erase(id);
  round_.dropped.insert(id);
  const bool participant = round_.participants.erase(id) > 0;
  round_.reports.erase(id);
  round_.done.erase(id);
  switch (stage_) {
    case Stage::kJoining:
      break;  // before the peer list: it just drops out
    case Stage::kTraining:
      if (round_.joined.empty()) {
        Reopen(now, fx);  // nobody left to wait for
      } else {
        CheckAllReady(now, fx);
      }
      break;
    case Stage::kConnecting:
    case Stage::kSharing:
      if (participant) ContinueWithParticipants(now, fx);
      break;
    default:
      break;
  }
}

// --- Status ----------------------------------------------------------------------------------

std::string DecentralizedTask::PeerStateName(const std::string& id, const PeerState& p) const {
  switch (p.model) {
    case Model::kUnknown:
      return "new";
    case Model::kNeedsSync:
    case Model::kSyncing:
      return "syncing";
    case Model::kSynced:
      break;
  }
  if (stage_ == Stage::kEvaluating || stage_ == Stage::kDone) {
    return eval_pending_.count(id) ? "evaluating" : "synced";
  }
  if (round_.participants.count(id)) {
    if (stage_ == Stage::kSharing) return round_.done.count(id) ? "done" : "sharing";
    if (stage_ == Stage::kConnecting) {
      auto it = round_.reports.find(id);
      return it != round_.reports.end() && it->second.empty() ? "connected" : "ready";
    }
  }
  if (round_.ready.count(id)) return "ready";
  if (round_.joined.count(id)) return "joined";
  return "synced";
}

void DecentralizedTask::Publish(const std::string& before, v1::TaskStatus& status,
                                ModeEffects& fx) {
  const uint64_t round = stage_ == Stage::kIdle ? completed_ : round_.number;
  status.set_round(round);
  status.set_model_version(completed_);
  const size_t participants = round_.participants.size();
  switch (stage_) {
    case Stage::kIdle:
      status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
      status.set_state(v1::TASK_STATE_WAITING);
      if (message_.empty()) message_ = "waiting for peers";
      break;
    case Stage::kJoining:
      status.set_phase(v1::ROUND_PHASE_JOINING);
      status.set_state(v1::TASK_STATE_RUNNING);
      message_ =
          round_.ready.empty()
              ? absl::StrCat("round ", round, ": joining (", round_.joined.size(), " joined)")
              : absl::StrCat("round ", round, ": waiting for peers (", round_.ready.size(),
                             " ready, need ", spec_.min_participants(), ")");
      break;
    case Stage::kTraining:
      status.set_phase(v1::ROUND_PHASE_TRAINING);
      status.set_state(v1::TASK_STATE_RUNNING);
      message_ = absl::StrCat("round ", round, ": training (", round_.ready.size(), " of ",
                              round_.joined.size(), " ready)");
      break;
    case Stage::kConnecting:
      status.set_phase(v1::ROUND_PHASE_CONNECTING);
      status.set_state(v1::TASK_STATE_RUNNING);
      message_ = absl::StrCat("round ", round, ": connecting ", participants, " peers (attempt ",
                              round_.attempt, ")");
      break;
    case Stage::kSharing:
      status.set_phase(v1::ROUND_PHASE_SHARING);
      status.set_state(v1::TASK_STATE_RUNNING);
      message_ = absl::StrCat("round ", round, ": sharing with ", participants, " peers");
      break;
    case Stage::kEvaluating:
      status.set_phase(v1::ROUND_PHASE_EVALUATING);
      status.set_state(v1::TASK_STATE_RUNNING);
      message_ = "evaluating the final model";
      break;
    case Stage::kDone:
      break;  // the core sets the final state, phase and message
  }
  if (stage_ != Stage::kDone) status.set_message(message_);
  status.clear_peers();
  for (const auto& [id, p] : peers_) {
    v1::PeerProgress* progress = status.add_peers();
    progress->set_peer_id(id);
    progress->set_state(PeerStateName(id, p));
    progress->set_model_round(p.model_round);
  }
  if (!fx.rounds_completed.empty() || status.SerializeAsString() != before) fx.changed = true;
}

std::unique_ptr<ModeTask> MakeDecentralizedTask(const v1::TaskStatus& status,
                                                const ModeOptions& options,
                                                CoordinatorMetrics& metrics) {
  return std::make_unique<DecentralizedTask>(status, metrics, options.final_eval_timeout);
}

}  // namespace shoal::coordinator
