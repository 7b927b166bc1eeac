#include "services/coordinator/secure_statistics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "libs/privacy/secagg/pairwise_round.h"

namespace shoal::coordinator {

SecureStatistics::SecureStatistics(std::string task, size_t need, double bound, size_t features,
                                   absl::Duration step_timeout)
    : task_(std::move(task)),
      need_(std::max<size_t>(need, 3)),
      bound_(bound),
      step_timeout_(step_timeout),
      features_(features) {}

bool SecureStatistics::IsParticipant(const std::string& peer) const {
  return std::binary_search(participants_.begin(), participants_.end(), peer);
}

void SecureStatistics::SendAll(const v1::SecureStatistics& step, Effects& fx) const {
  for (const std::string& p : participants_) fx.sends.emplace_back(p, step);
}

absl::Status SecureStatistics::Receive(const std::string& peer, const std::string& identity_key,
                                       const v1::SecureMoments& step, absl::Time now, Effects& fx) {
  if (dropped_.count(peer) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure moments: peer ", peer,
        " was dropped from the masking for not answering a step in time; it takes part again "
        "only in a new session"));
  }
  if (step.has_key() && step.attempt() < attempt_) {
    // A peer that started before the masking restarted (or joined since): it masks again too.
    v1::SecureStatistics restart;
    restart.set_attempt(attempt_);
    restart.set_restart(true);
    fx.sends.emplace_back(peer, restart);
    return absl::OkStatus();
  }
  if (step.attempt() != attempt_) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure moments of attempt ", step.attempt(), ", the current is ", attempt_));
  }
  switch (step.step_case()) {
    case v1::SecureMoments::kKey:
      return OnKey(peer, identity_key, step.key(), now, fx);
    case v1::SecureMoments::kMasked:
      return OnMasked(peer, step.masked(), now, fx);
    case v1::SecureMoments::kSelfSeed:
      return OnSeed(peer, step.self_seed(), fx);
    default:
      return absl::InvalidArgumentError("secure moments: no step");
  }
}

absl::Status SecureStatistics::OnKey(const std::string& peer, const std::string& identity,
                                     const v1::StatisticsMaskKey& key, absl::Time now,
                                     Effects& fx) {
  if (identity.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure moments: peer ", peer, " sent no identity key in its Hello"));
  }
  if (key.mask_public_key().empty() || key.mask_key_signature().empty()) {
    return absl::InvalidArgumentError("secure moments: a mask key without key or signature");
  }
  if (features_ == 0) features_ = key.features();
  if (key.features() != features_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data moments: ", key.features(), " features, but the task's peers have ", features_));
  }
  if (!codec_.has_value()) {
    absl::StatusOr<privacy::MomentsCodec> codec = privacy::MomentsCodec::Create(features_, bound_);
    if (!codec.ok()) return codec.status();
    codec_ = *codec;
  }
  keys_[peer] = Key{identity, key};
  if (IsParticipant(peer)) {
    // It set up again (a new session): its masking is gone, so every participant masks anew.
    LogWarning("task ", task_, ": peer ", peer, " sent a new mask key during the masking (attempt ",
               attempt_, "); the peers mask again");
    Restart(fx);
    return absl::OkStatus();
  }
  if (!participants_.empty()) return absl::OkStatus();  // a masking runs: it waits for the sum
  if (keys_.size() < need_) {
    LogInfo("task ", task_, ": mask keys of ", keys_.size(), " of ", need_,
            " peers for the federation's secure statistics");
    return absl::OkStatus();
  }
  v1::SecureStatistics list;
  list.set_attempt(attempt_);
  for (const auto& [id, k] : keys_) {
    participants_.push_back(id);
    v1::PeerEndpoint& e = *list.mutable_participants()->add_participants();
    e.set_peer_id(id);
    e.set_identity_public_key(k.identity);
    e.set_mask_public_key(k.key.mask_public_key());
    e.set_mask_key_signature(k.key.mask_key_signature());
  }
  LogInfo("task ", task_, ": secure statistics attempt ", attempt_, ": masking among ",
          participants_.size(), " peers");
  step_deadline_ = now + step_timeout_;
  SendAll(list, fx);
  return absl::OkStatus();
}

absl::Status SecureStatistics::OnMasked(const std::string& peer, const std::string& bytes,
                                        absl::Time now, Effects& fx) {
  if (!IsParticipant(peer) || masked_.count(peer) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure moments: no masked moments asked of peer ", peer));
  }
  const size_t length = codec_->length();
  if (bytes.size() != 4 * length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure moments: ", bytes.size(), " bytes of masked moments, expected ", 4 * length));
  }
  std::vector<uint32_t> values(length);
  for (size_t i = 0; i < length; ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data() + 4 * i);
    values[i] = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
  }
  masked_[peer] = std::move(values);
  if (masked_.size() < participants_.size()) return absl::OkStatus();
  v1::SecureStatistics unmask;
  unmask.set_attempt(attempt_);
  unmask.set_unmask(true);
  step_deadline_ = now + step_timeout_;
  SendAll(unmask, fx);
  return absl::OkStatus();
}

absl::Status SecureStatistics::OnSeed(const std::string& peer, const std::string& seed,
                                      Effects& fx) {
  if (masked_.size() < participants_.size() || !IsParticipant(peer) || seeds_.count(peer) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure moments: no self seed asked of peer ", peer));
  }
  seeds_[peer] = seed;
  if (seeds_.size() < participants_.size()) return absl::OkStatus();
  absl::Status s = Finish(fx);
  if (!s.ok()) {
    LogWarning("task ", task_, ": the secure statistics' sum of attempt ", attempt_,
               " does not decode (", s.message(), "); the peers mask again");
    fx.total.reset();
    Restart(fx);
  }
  return s;
}

absl::Status SecureStatistics::Finish(Effects& fx) {
  absl::StatusOr<privacy::secagg::MaskedSum> sum =
      privacy::secagg::MaskedSum::Start(participants_, participants_, codec_->length(), 32);
  if (!sum.ok()) return sum.status();
  for (const std::string& p : participants_) {
    if (absl::Status s = sum->AddMasked(p, masked_.at(p)); !s.ok()) return s;
    privacy::secagg::MaskReveal reveal;
    reveal.self_seed = seeds_.at(p);
    if (absl::Status s = sum->Unmask(p, reveal); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<uint32_t>> ring = sum->Finish();
  if (!ring.ok()) return ring.status();
  absl::StatusOr<data::FeatureMoments> total =
      codec_->DecodeSum(*ring, static_cast<int>(participants_.size()));
  if (!total.ok()) return total.status();
  fx.total = *std::move(total);
  fx.peers = participants_;
  return absl::OkStatus();
}

void SecureStatistics::Left(const std::string& peer, Effects& fx) {
  keys_.erase(peer);
  dropped_.erase(peer);
  if (!IsParticipant(peer)) return;
  LogWarning("task ", task_, ": peer ", peer, " left the secure statistics' masking (attempt ",
             attempt_, "); the others mask again");
  Restart(fx);
}

void SecureStatistics::Expire(absl::Time now, Effects& fx) {
  if (participants_.empty() || now < step_deadline_) return;
  const bool masking = masked_.size() < participants_.size();
  for (const std::string& p : participants_) {
    if ((masking ? masked_.count(p) : seeds_.count(p)) > 0) continue;
    fx.dropped.push_back(p);
    dropped_.insert(p);
    keys_.erase(p);  // not told to restart
  }
  if (fx.dropped.empty()) return;  // not reached: a step with every answer in has ended
  LogWarning("task ", task_, ": ", fx.dropped.size(), " of ", participants_.size(),
             " participants of the secure statistics' masking (attempt ", attempt_, ") sent no ",
             masking ? "masked moments" : "self-mask seed", " within ",
             absl::FormatDuration(step_timeout_), ": ", absl::StrJoin(fx.dropped, ", "),
             " dropped; the others mask again");
  Restart(fx);
}

void SecureStatistics::Restart(Effects& fx) {
  ++attempt_;
  step_deadline_ = absl::InfiniteFuture();
  participants_.clear();
  masked_.clear();
  seeds_.clear();
  v1::SecureStatistics restart;
  restart.set_attempt(attempt_);
  restart.set_restart(true);
  for (const auto& [id, key] : keys_) fx.sends.emplace_back(id, restart);
  keys_.clear();
}

}  // namespace shoal::coordinator
