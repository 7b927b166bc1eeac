// DecentralizedTask: after every joiner is ready, the participants connect to each other
// (PeerList, ConnectionsReport, retries, blame, removal) and share their updates (StartSharing,
// SharingDone).

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "libs/task/task_privacy.h"
#include "services/coordinator/modes/decentralized/decentralized_task.h"

namespace shoal::coordinator {
namespace {

// The peers to blame for failed connections: repeatedly the peer involved in the most failed
// pairs (as reporter or target), ties broken towards a peer someone reported unreachable, then
// by id, until no failed pair is left.
std::set<std::string> Blame(const std::set<std::pair<std::string, std::string>>& reports) {
  std::set<std::pair<std::string, std::string>> pairs;  // unordered, stored sorted
  std::set<std::string> targets;
  for (const auto& [reporter, target] : reports) {
    pairs.insert(std::minmax(reporter, target));
    targets.insert(target);
  }
  std::set<std::string> blamed;
  while (!pairs.empty()) {
    std::map<std::string, int> count;
    for (const auto& [a, b] : pairs) {
      ++count[a];
      ++count[b];
    }
    std::string pick;
    int best = -1;
    bool best_target = false;
    for (const auto& [id, n] : count) {  // ascending id: the first of equals wins
      const bool is_target = targets.count(id) > 0;
      if (n > best || (n == best && is_target && !best_target)) {
        pick = id;
        best = n;
        best_target = is_target;
      }
    }
    blamed.insert(pick);
    for (auto it = pairs.begin(); it != pairs.end();) {
      it = (it->first == pick || it->second == pick) ? pairs.erase(it) : std::next(it);
    }
  }
  return blamed;
}

}  // namespace

absl::Status DecentralizedTask::OnConnectionsReport(const std::string& id,
                                                    const v1::ConnectionsReport& m, absl::Time now,
                                                    ModeEffects& fx) {
  if (stage_ != Stage::kConnecting || m.round() != round_.number || m.attempt() != round_.attempt ||
      !round_.participants.count(id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "connections report for round ", m.round(), " attempt ", m.attempt(), " is not expected"));
  }
  std::set<std::string>& unreachable = round_.reports[id];
  unreachable.clear();
  for (const std::string& target : m.unreachable()) {
    if (target != id && round_.participants.count(target)) unreachable.insert(target);
  }
  CheckReports(now, fx);
  return absl::OkStatus();
}

absl::Status DecentralizedTask::OnSharingDone(const std::string& id, const v1::SharingDone& m,
                                              absl::Time now, ModeEffects& fx) {
  if (stage_ != Stage::kSharing || m.round() != round_.number || m.attempt() != round_.attempt ||
      !round_.participants.count(id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sharing done for round ", m.round(), " attempt ", m.attempt(), " is not expected"));
  }
  round_.done[id] = Done{m.digest_xxh3(), m.num_samples()};
  CheckSharingDone(now, fx);
  return absl::OkStatus();
}

absl::Status DecentralizedTask::OnMaskedUpdatesHeld(const std::string& id,
                                                    const v1::MaskedUpdatesHeld& m,
                                                    ModeEffects& fx) {
  if (!secure_ || stage_ != Stage::kSharing || round_.unmasking || m.round() != round_.number ||
      m.attempt() != round_.attempt || !round_.participants.count(id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "masked updates held for round ", m.round(), " attempt ", m.attempt(), " is not expected"));
  }
  round_.held.insert(id);
  for (const std::string& p : round_.participants) {
    if (!round_.held.count(p)) return absl::OkStatus();
  }
  // Everyone holds every masked update: the survivors are fixed for good.
  round_.unmasking = true;
  LogInfo("task ", task_, ": round ", round_.number, ": the survivors are ",
          absl::StrJoin(round_.participants, ", "), "; asking for their seeds");
  v1::CoordinatorEvent e;
  v1::Unmask* unmask = e.mutable_unmask();
  unmask->set_round(round_.number);
  unmask->set_attempt(round_.attempt);
  for (const std::string& p : round_.participants) unmask->add_survivors(p);
  for (const std::string& p : round_.participants) fx.Send(p, e);
  return absl::OkStatus();
}

absl::Status DecentralizedTask::OnMaskReveal(const std::string& id, const v1::MaskReveal& m,
                                             ModeEffects& fx) {
  if (!secure_ || stage_ != Stage::kSharing || !round_.unmasking || m.round() != round_.number ||
      m.attempt() != round_.attempt || !round_.participants.count(id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mask reveal for round ", m.round(), " attempt ", m.attempt(), " is not expected"));
  }
  round_.reveals[id] = m.seeds();
  for (const std::string& p : round_.participants) {
    if (!round_.reveals.count(p)) return absl::OkStatus();
  }
  v1::CoordinatorEvent e;
  v1::MaskReveals* reveals = e.mutable_mask_reveals();
  reveals->set_round(round_.number);
  reveals->set_attempt(round_.attempt);
  for (const auto& [p, seeds] : round_.reveals) (*reveals->mutable_seeds())[p] = seeds;
  for (const std::string& p : round_.participants) fx.Send(p, e);
  round_.revealed = true;
  return absl::OkStatus();
}

absl::Status DecentralizedTask::CheckMaskKey(const std::string& id, const v1::RoundReady& m) {
  if (!secure_ || (!m.mask_public_key().empty() && !peers_[id].identity_public_key.empty())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "secure aggregation: peer ", id, " sent ",
      m.mask_public_key().empty() ? "no mask key with its RoundReady" : "no identity key"));
}

bool DecentralizedTask::HoldsUpSharing(const std::string& id) const {
  if (!secure_ || round_.revealed) return !round_.done.count(id);
  return round_.unmasking ? !round_.reveals.count(id) : !round_.held.count(id);
}

void DecentralizedTask::RestartSecureRound(const std::string& why, absl::Time now,
                                           ModeEffects& fx) {
  LogWarning("task ", task_, ": round ", round_.number, ": ", why,
             " after the survivors were fixed; the round starts over");
  v1::CoordinatorEvent e;
  e.mutable_join_refused()->set_round(round_.number);
  e.mutable_join_refused()->set_reason(
      absl::StrCat(why, " after the survivors' seeds were asked for; the round starts over"));
  for (const std::string& id : round_.participants) {
    fx.Send(id, e);
    round_.joined.erase(id);
    round_.ready.erase(id);
  }
  Reopen(now, fx);
}

void DecentralizedTask::StartConnecting(absl::Time now, ModeEffects& fx) {
  round_.participants.clear();
  for (const auto& [id, r] : round_.ready) round_.participants.insert(id);
  round_.retries = 0;
  stage_ = Stage::kConnecting;
  SendPeerLists(/*sharing=*/false, now, fx);
}

void DecentralizedTask::SendPeerLists(bool sharing, absl::Time now, ModeEffects& fx) {
  ++round_.attempt;
  round_.reports.clear();
  round_.done.clear();
  round_.held.clear();
  round_.stage_deadline = now + round_deadline_;
  v1::CoordinatorEvent e;
  v1::PeerList* list = e.mutable_peer_list();
  list->set_round(round_.number);
  list->set_attempt(round_.attempt);
  list->set_sharing(sharing);
  for (const std::string& id : round_.participants) {
    v1::PeerEndpoint* endpoint = list->add_participants();
    endpoint->set_peer_id(id);
    endpoint->set_address(peers_[id].address);
    if (secure_) {
      const Ready& ready = round_.ready[id];
      endpoint->set_identity_public_key(peers_[id].identity_public_key);
      endpoint->set_mask_public_key(ready.mask_public_key);
      endpoint->set_mask_key_signature(ready.mask_key_signature);
    }
  }
  for (const std::string& id : round_.participants) fx.Send(id, e);
}

void DecentralizedTask::CheckReports(absl::Time now, ModeEffects& fx) {
  if (round_.reports.size() < round_.participants.size()) return;
  std::set<std::pair<std::string, std::string>> failed;
  for (const auto& [reporter, unreachable] : round_.reports) {
    for (const std::string& target : unreachable) failed.insert({reporter, target});
  }
  if (failed.empty()) {
    stage_ = Stage::kSharing;
    round_.done.clear();
    round_.stage_deadline = now + round_deadline_;
    v1::CoordinatorEvent e;
    e.mutable_start_sharing()->set_round(round_.number);
    e.mutable_start_sharing()->set_attempt(round_.attempt);
    for (const std::string& id : round_.participants) fx.Send(id, e);
    return;
  }
  if (round_.retries < max_retry_) {
    ++round_.retries;
    ++round_.total_retries;
    metrics_.decentralized.connection_retries.Increment();
    LogWarning("task ", task_, ": round ", round_.number, ": ", failed.size(),
               " connections failed, retry ", round_.retries, " of ", max_retry_);
    SendPeerLists(/*sharing=*/false, now, fx);
    return;
  }
  RemoveFromRound(Blame(failed), "could not connect to the other participants", now, fx);
}

void DecentralizedTask::RemoveFromRound(const std::set<std::string>& ids, const std::string& reason,
                                        absl::Time now, ModeEffects& fx) {
  for (const std::string& id : ids) {
    LogWarning("task ", task_, ": peer ", id, " removed from round ", round_.number, ": ", reason);
    v1::CoordinatorEvent e;
    e.mutable_connection_failed()->set_round(round_.number);
    e.mutable_connection_failed()->set_reason(reason);
    fx.Send(id, std::move(e));
    round_.participants.erase(id);
    round_.ready.erase(id);
    round_.joined.erase(id);
    round_.excluded.insert(id);
    round_.dropped.insert(id);
    round_.removed.push_back(id);
    metrics_.decentralized.removed_peers.Increment();
    PeerState& p = peers_[id];
    p.strikes = std::min<uint32_t>(p.strikes + 1, 5);
    p.sit_out_until = round_.number + (uint64_t{1} << (p.strikes - 1));
  }
  round_.retries = 0;  // the rest start counting again
  ContinueWithParticipants(now, fx);
}

void DecentralizedTask::ContinueWithParticipants(absl::Time now, ModeEffects& fx) {
  if (secure_ && stage_ == Stage::kSharing && round_.revealed) {
    // Every seed is out: the others finish without it (its update is in their sum).
    CheckSharingDone(now, fx);
    return;
  }
  if (secure_ && stage_ == Stage::kSharing && round_.unmasking) {
    RestartSecureRound("a survivor left", now, fx);
    return;
  }
  if (round_.participants.size() < std::max<uint32_t>(1, spec_.min_participants())) {
    SendWaiting(round_.participants, round_.participants.size(), fx);
    Reopen(now, fx);
    return;
  }
  if (stage_ == Stage::kSharing && secure_ && task::HasDistributedNoise(spec_)) {
    // privacy.dp with noise distributed: the survivors' shares must add up to the full noise,
    // and the one lost took its share along. The others mask again, each with a share for
    // their new number; the earlier masking is never unmasked.
    LogInfo("task ", task_, ": round ", round_.number,
            ": the participants mask again with their noise shares for ",
            round_.participants.size());
    stage_ = Stage::kConnecting;
  }
  SendPeerLists(/*sharing=*/stage_ == Stage::kSharing, now, fx);
}

void DecentralizedTask::CheckSharingDone(absl::Time now, ModeEffects& fx) {
  if (stage_ != Stage::kSharing) return;
  for (const std::string& id : round_.participants) {
    if (!round_.done.count(id)) return;
  }
  CompleteRound(now, fx);
}

}  // namespace shoal::coordinator
