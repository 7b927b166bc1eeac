// DecentralizedRunner, secure aggregation (privacy.secure_aggregation): the masking at each
// PeerList, the reveals for the survivors (Unmask) and the unmasked average (MaskReveals). The
// masked updates are fetched in decentralized_sharing.cc (ShareMasked); the masking itself is
// SecureRound's.

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"

namespace shoal::peer {

absl::Status DecentralizedRunner::AddMaskKey(coordinator::v1::RoundReady& ready) const {
  if (!secure_) return absl::OkStatus();
  if (!round_ || !round_->secure) {
    return absl::FailedPreconditionError("secure aggregation: no masking for this round");
  }
  absl::StatusOr<privacy::secagg::MaskKey> key = round_->secure->Advertise(*deps_.identity);
  if (!key.ok()) return key.status();
  ready.set_mask_public_key(key->public_key);
  ready.set_mask_key_signature(key->signature);
  return absl::OkStatus();
}

bool DecentralizedRunner::MaskForPeerList(const coordinator::v1::PeerList& m) {
  if (!round_->secure) {
    SendError(m.round(), absl::FailedPreconditionError(
                             "secure aggregation: this peer has no masking for the round"));
    return false;
  }
  absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> served =
      round_->secure->Mask(m.attempt(), participants_, &noise_);
  if (!served.ok()) {
    // Nothing of an earlier masking is served any more.
    snapshots_.Clear(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
    LogError("task ", task_, " round ", m.round(),
             ": cannot mask the round update: ", served.status().message());
    SendError(m.round(), served.status());
    return false;
  }
  Snapshot update;
  update.task = task_;
  update.version = m.round();
  update.model = *std::move(served);
  update.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
  update.round = m.round();
  update.num_samples = round_->num_samples;
  update.loss = round_->train_loss;
  snapshots_.Publish(std::move(update));
  LogInfo("task ", task_, " round ", m.round(), " attempt ", m.attempt(),
          ": serving the round update masked with ",
          absl::StrJoin(round_->secure->masked_with(), ", "));
  return true;
}

void DecentralizedRunner::HandleUnmask(const coordinator::v1::Unmask& m) {
  if (!round_ || round_->round != m.round() || !round_->secure) {
    LogWarning("task ", task_, ": Unmask for round ", m.round(),
               " which this peer has no masking of; ignored");
    return;
  }
  absl::StatusOr<coordinator::v1::SeedReveal> seeds = round_->secure->Reveal(m);
  if (!seeds.ok()) {
    LogError("task ", task_, " round ", m.round(),
             ": refusing to reveal: ", seeds.status().message());
    SendError(m.round(), seeds.status());
    return;
  }
  LogInfo("task ", task_, " round ", m.round(), " attempt ", m.attempt(),
          ": revealing the seeds for the survivors ", absl::StrJoin(m.survivors(), ", "), " (",
          seeds->pair_seeds_size(), " pairwise seeds with dropped participants)");
  coordinator::v1::PeerMessage out;
  auto* reveal = out.mutable_mask_reveal();
  reveal->set_round(m.round());
  reveal->set_attempt(m.attempt());
  *reveal->mutable_seeds() = *std::move(seeds);
  Send(out);
}

void DecentralizedRunner::HandleMaskReveals(const coordinator::v1::MaskReveals& m) {
  if (!round_ || round_->round != m.round() || !round_->secure) {
    LogWarning("task ", task_, ": MaskReveals for round ", m.round(),
               " which this peer has no masking of; ignored");
    return;
  }
  const absl::Time start = clock_.Now();
  absl::StatusOr<SecureRound::Result> result = round_->secure->Finish(m, RoundBase());
  if (!result.ok()) {
    LogError("task ", task_, " round ", m.round(),
             ": cannot remove the masks: ", result.status().message());
    SendError(m.round(), result.status());
    return;
  }
  const std::string what = absl::StrCat(
      result->survivors.size(),
      " masked updates (secure aggregation: ", absl::StrJoin(result->survivors, ", "), ")");
  CompleteSharing(m.round(), m.attempt(), std::move(result->model), result->num_samples, start,
                  what);
}

}  // namespace shoal::peer
