// DecentralizedTask: model sync (a peer that holds no model of the last completed round gets it
// from a provider that does) and the rounds a restarted coordinator adopts from its peers.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "services/coordinator/modes/decentralized/decentralized_task.h"

namespace shoal::coordinator {

absl::Status DecentralizedTask::OnModelHeld(const std::string& id, const v1::ModelHeld& m,
                                            absl::Time now, ModeEffects& fx) {
  // A peer announces its model after TaskAssigned and after a sync. If it was in the round, it
  // restarted and lost its round state.
  if (InRound(id)) DropFromRound(id, now, fx);
  PeerState& p = peers_[id];
  p.model_round = m.round();
  // A model of the right round but not the one the round produced (a peer of another run of the
  // task, a corrupted restart) is replaced by a sync. Digest 0 means "not computed".
  const bool wrong_model = m.round() == completed_ && m.digest_xxh3() != 0 &&
                           completed_digest_ != 0 && m.digest_xxh3() != completed_digest_;
  if (m.round() == completed_ && !wrong_model) {
    MarkSynced(id, m.round(), now, fx);
    return absl::OkStatus();
  }
  // Nobody holds the stored round any more when every peer moved past it before the crash:
  // syncing them back to it would wait forever for a provider.
  if (m.round() == completed_ + 1 && m.digest_xxh3() != 0 && stage_ == Stage::kIdle &&
      round_.number == 0 && !finished_) {
    AdoptRoundCompletedBeforeRestart(id, m, now, fx);
    return absl::OkStatus();
  }
  if (wrong_model) {
    LogWarning("task ", task_, ": peer ", id, " holds a round ", m.round(),
               " model that is not the round's; syncing it");
  } else if (m.round() > completed_) {
    LogWarning("task ", task_, ": peer ", id, " holds round ", m.round(), " but only ", completed_,
               " completed; syncing it");
  }
  syncs_.erase(id);
  p.model = Model::kNeedsSync;
  StartSync(id, now, fx);
  return absl::OkStatus();
}

absl::Status DecentralizedTask::OnSyncDone(const std::string& id, const v1::SyncDone& m,
                                           absl::Time now, ModeEffects& fx) {
  auto it = syncs_.find(id);
  if (it == syncs_.end() || it->second.provider != m.provider() || it->second.round != m.round()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sync of round ", m.round(), " from ", m.provider(), " is not expected"));
  }
  if (!m.ok()) {
    FailSync(id, absl::StrCat("provider ", m.provider(), ": ", m.message()), now, fx);
    return absl::OkStatus();
  }
  const absl::Duration took =
      m.duration_ms() > 0 ? absl::Milliseconds(m.duration_ms()) : now - it->second.started;
  metrics_.decentralized.sync_transfers.Increment();
  metrics_.decentralized.sync_duration.Observe(absl::ToDoubleSeconds(took));
  LogInfo("task ", task_, ": peer ", id, " synced round ", m.round(), " from ", m.provider(),
          " in ", absl::FormatDuration(took), " (", m.bytes(), " bytes)");
  syncs_.erase(it);
  // Still syncing until its ModelHeld names the round it loaded.
  return absl::OkStatus();
}

void DecentralizedTask::StartSync(const std::string& id, absl::Time now, ModeEffects& fx) {
  PeerState& p = peers_[id];
  Sync& sync = syncs_[id];
  // Failures count against the round they were for: a newer round has its own providers.
  if (sync.round != completed_) {
    sync.failed.clear();
    sync.retry_at = absl::InfinitePast();
  }
  // Providers hold the last completed round; prefer one serving nobody and outside the round.
  std::map<std::string, int> serving;
  for (const auto& [joiner, s] : syncs_) {
    if (joiner != id && !s.provider.empty()) ++serving[s.provider];
  }
  std::vector<std::pair<std::pair<int, int>, std::string>> candidates;
  for (const auto& [pid, ps] : peers_) {
    if (pid == id || ps.model != Model::kSynced || ps.model_round != completed_) continue;
    candidates.push_back({{serving[pid], InRound(pid) ? 1 : 0}, pid});
  }
  std::vector<std::pair<std::pair<int, int>, std::string>> fresh;
  for (const auto& c : candidates) {
    if (!sync.failed.count(c.second)) fresh.push_back(c);
  }
  if (fresh.empty() && !candidates.empty()) {
    // Every provider failed this joiner once: they are all tried again, but not more often than
    // every kSyncRetryPause (one that cannot serve the round would be asked again at once,
    // thousands of times a second); meanwhile Tick tries again, and a new provider at once.
    if (now < sync.retry_at) {
      sync.provider.clear();
      p.model = Model::kNeedsSync;
      return;
    }
    sync.failed.clear();
    sync.retry_at = now + kSyncRetryPause;
    fresh = candidates;
  }
  if (fresh.empty()) {
    syncs_.erase(id);
    p.model = Model::kNeedsSync;  // Tick tries again when a provider appears
    return;
  }
  std::sort(fresh.begin(), fresh.end());
  const std::string& provider = fresh.front().second;
  p.model = Model::kSyncing;
  sync.provider = provider;
  sync.round = completed_;
  sync.started = now;
  sync.deadline = now + round_deadline_;
  LogInfo("task ", task_, ": peer ", id, " syncs round ", completed_, " from ", provider);
  v1::CoordinatorEvent serve;
  serve.mutable_sync_serve()->set_round(completed_);
  serve.mutable_sync_serve()->set_peer_id(id);
  fx.Send(provider, std::move(serve));
  v1::CoordinatorEvent from;
  from.mutable_sync_from()->set_round(completed_);
  from.mutable_sync_from()->mutable_provider()->set_peer_id(provider);
  from.mutable_sync_from()->mutable_provider()->set_address(peers_[provider].address);
  fx.Send(id, std::move(from));
}

void DecentralizedTask::FailSync(const std::string& id, const std::string& why, absl::Time now,
                                 ModeEffects& fx) {
  auto it = syncs_.find(id);
  if (it == syncs_.end()) return;
  LogWarning("task ", task_, ": model sync of peer ", id, " failed: ", why);
  metrics_.decentralized.sync_failures.Increment();
  it->second.failed.insert(it->second.provider);
  it->second.provider.clear();
  StartSync(id, now, fx);
}

void DecentralizedTask::MarkSynced(const std::string& id, uint64_t round, absl::Time now,
                                   ModeEffects& fx) {
  PeerState& p = peers_[id];
  p.model = Model::kSynced;
  p.model_round = round;
  syncs_.erase(id);
  // A newly synced peer can join a round that is open for it.
  if (stage_ == Stage::kJoining && round_.joins_open && round + 1 == round_.number &&
      !round_.joined.count(id) && !round_.excluded.count(id)) {
    if (SitsOut(id) && round_.offered.size() >= spec_.min_participants()) {
      LogInfo("task ", task_, ": peer ", id, " sits out round ", round_.number,
              " after failing to connect");
    } else {
      Offer(id, now, fx);
    }
  }
}

void DecentralizedTask::AdoptRoundCompletedBeforeRestart(const std::string& id,
                                                         const v1::ModelHeld& m, absl::Time now,
                                                         ModeEffects& fx) {
  const uint64_t r = m.round();
  LogWarning("task ", task_, ": peer ", id, " holds round ", r,
             ", completed before the coordinator restarted; resuming after it");
  // What is known of the round: its model. Participants, samples and loss died with the old
  // coordinator; peers that hold it say so with their ModelHeld.
  v1::RoundSummary summary;
  summary.set_round(r);
  summary.set_model_version(r);
  summary.set_model_digest(m.digest_xxh3());
  fx.rounds_completed.push_back(summary);
  completed_ = r;
  completed_digest_ = m.digest_xxh3();
  round_ = Round{};
  round_.number = r;
  message_.clear();
  MarkSynced(id, r, now, fx);
  if (r >= spec_.rounds()) {
    stage_ = Stage::kEvaluating;
    eval_pending_.clear();
    eval_deadline_ = absl::InfinitePast();
    return;
  }
  // Peers already counted at the round before hold an older model now: they sync.
  for (auto& [pid, p] : peers_) {
    if (pid != id && (p.model == Model::kSynced || p.model == Model::kSyncing) &&
        p.model_round < r) {
      syncs_.erase(pid);
      p.model = Model::kNeedsSync;
      StartSync(pid, now, fx);
    }
  }
}

std::set<std::string> DecentralizedTask::SyncedAtCompleted() const {
  std::set<std::string> out;
  for (const auto& [id, p] : peers_) {
    if (p.model == Model::kSynced && p.model_round == completed_) out.insert(id);
  }
  return out;
}

void DecentralizedTask::FailIfModelLost(absl::Time now, ModeEffects& fx) {
  const std::set<std::string> holders = SyncedAtCompleted();
  if (!holders.empty()) last_holders_ = holders;
  std::vector<std::string> waiting;
  for (const auto& [id, p] : peers_) {
    if (p.model == Model::kNeedsSync) waiting.push_back(id);
  }
  // Round 0's model every peer makes from the seed.
  if (completed_ == 0 || finished_ || stage_ == Stage::kEvaluating || !holders.empty() ||
      waiting.empty()) {
    model_unheld_since_.reset();
    return;
  }
  if (!model_unheld_since_.has_value()) model_unheld_since_ = now;
  const absl::Duration lost_after = std::max(absl::Seconds(60), 3 * round_deadline_);
  if (now - *model_unheld_since_ < lost_after) return;
  const std::string message = absl::StrCat(
      "round ", completed_, "'s model is lost: no peer holding it has been present for ",
      absl::FormatDuration(lost_after), " (it was held last by ",
      last_holders_.empty() ? std::string("peers before a restart")
                            : absl::StrJoin(last_holders_, ", "),
      "; waiting for it: ", absl::StrJoin(waiting, ", "),
      "); start the task again to train from the beginning");
  LogError("task ", task_, ": ", message);
  finished_ = true;
  stage_ = Stage::kDone;
  fx.finish = {v1::TASK_STATE_FAILED, message};
}

}  // namespace shoal::coordinator
