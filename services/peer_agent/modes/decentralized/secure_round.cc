#include "services/peer_agent/modes/decentralized/secure_round.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/secagg/update_codec.h"

namespace shoal::peer {

using coordinator::v1::PeerEndpoint;
using privacy::secagg::MaskKey;
using privacy::secagg::MaskReveal;

tensor::ModelLayout SecureRound::MaskedLayout(size_t elements) {
  absl::StatusOr<tensor::ModelLayout> layout = tensor::ModelLayout::Create({tensor::TensorSpec{
      "masked_update", {static_cast<int64_t>(elements)}, tensor::Element::kUint32}});
  return *std::move(layout);  // a fixed name and a non-negative size: always valid
}

SecureRound::SecureRound(privacy::secagg::PairwiseMasker masker, double clip_norm,
                         std::vector<float> delta, uint64_t num_samples)
    : masker_(std::move(masker)),
      clip_norm_(clip_norm),
      delta_(std::move(delta)),
      num_samples_(num_samples) {}

absl::StatusOr<SecureRound> SecureRound::Start(const std::string& task, uint64_t round,
                                               const std::string& self_id, double clip_norm,
                                               uint64_t num_samples, const tensor::FlatModel& base,
                                               const tensor::FlatModel& trained) {
  if (!(base.layout == trained.layout) || base.values.size() != trained.values.size()) {
    return absl::InvalidArgumentError("secure round: the trained model's layout is not the base's");
  }
  SHOAL_RETURN_IF_ERROR(privacy::secagg::UpdateCodec(clip_norm, 1, /*noise_stddev=*/0).status());
  std::vector<float> delta(trained.values.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = trained.values[i] - base.values[i];
  SHOAL_ASSIGN_OR_RETURN(privacy::secagg::PairwiseMasker masker,
                         privacy::secagg::PairwiseMasker::Create(
                             absl::StrCat("decentralized/", task, "/", round), self_id));
  return SecureRound(std::move(masker), clip_norm, std::move(delta), num_samples);
}

absl::StatusOr<MaskKey> SecureRound::Advertise(const privacy::secagg::KeySigner& identity) const {
  return masker_.Advertise(identity);
}

absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> SecureRound::Mask(
    uint32_t attempt, const std::vector<PeerEndpoint>& participants, UpdatePrivacy* noise) {
  std::map<std::string, MaskKey> keys;
  std::map<std::string, std::string> identities;
  for (const PeerEndpoint& p : participants) {
    if (p.identity_public_key().empty() || p.mask_public_key().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation: the peer list gives participant ", p.peer_id(),
          " no identity or mask key (a coordinator or peer without secure aggregation?)"));
    }
    keys[p.peer_id()] = MaskKey{p.mask_public_key(), p.mask_key_signature()};
    identities[p.peer_id()] = p.identity_public_key();
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<privacy::secagg::Ed25519KeyVerifier> verifier,
                         privacy::secagg::Ed25519KeyVerifier::Create(std::move(identities)));
  const double stddev =
      noise != nullptr ? noise->NoiseStddev(static_cast<uint32_t>(participants.size())) : 0;
  SHOAL_ASSIGN_OR_RETURN(
      privacy::FixedPointCodec codec,
      privacy::secagg::UpdateCodec(clip_norm_, static_cast<int>(participants.size()), stddev));
  std::vector<uint32_t> encoded;
  if (noise != nullptr && noise->enabled()) {
    // Clipped, then noised: clamping each value keeps the noise that clipping again would cut.
    std::vector<float> noisy = delta_;
    noise->Apply(absl::MakeSpan(noisy), static_cast<uint32_t>(participants.size()));
    SHOAL_ASSIGN_OR_RETURN(encoded, privacy::secagg::ClampAndEncode(codec, noisy));
  } else {
    SHOAL_ASSIGN_OR_RETURN(encoded, privacy::secagg::ClipAndEncode(codec, delta_));
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint32_t> masked,
                         masker_.Mask(attempt, keys, *verifier, encoded, codec.bits()));
  held_.clear();
  codec_ = codec;
  mask_attempt_ = attempt;
  auto served = std::make_shared<tensor::FlatModel>();
  served->layout = MaskedLayout(masked.size());
  served->values.resize(masked.size());
  std::memcpy(served->values.data(), masked.data(), masked.size() * sizeof(uint32_t));
  own_masked_ = std::move(masked);
  return std::shared_ptr<const tensor::FlatModel>(std::move(served));
}

absl::Status SecureRound::Hold(const std::string& peer_id, const tensor::FlatModel& served,
                               uint64_t num_samples) {
  const std::vector<std::string>& with = masker_.masked_with();
  if (!std::binary_search(with.begin(), with.end(), peer_id) || peer_id == masker_.self_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("masked update of ", peer_id, ", which this peer did not mask with"));
  }
  if (!(served.layout == MaskedLayout(own_masked_.size())) ||
      served.values.size() != own_masked_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer_id, " served a masked update of ",
                                                   served.layout.DebugString(), ", expected ",
                                                   MaskedLayout(own_masked_.size()).DebugString()));
  }
  Held h;
  h.num_samples = num_samples;
  // Every 32-bit value is an element of the ring: the bits are taken as they came.
  h.masked.resize(own_masked_.size());
  std::memcpy(h.masked.data(), served.values.data(), h.masked.size() * sizeof(uint32_t));
  held_[peer_id] = std::move(h);
  return absl::OkStatus();
}

absl::StatusOr<coordinator::v1::SeedReveal> SecureRound::Reveal(const coordinator::v1::Unmask& m) {
  std::vector<std::string> survivors(m.survivors().begin(), m.survivors().end());
  SHOAL_ASSIGN_OR_RETURN(MaskReveal reveal, masker_.Reveal(mask_attempt_, survivors));
  std::sort(survivors.begin(), survivors.end());
  survivors_ = std::move(survivors);
  coordinator::v1::SeedReveal out;
  out.set_self_seed(reveal.self_seed);
  for (const auto& [id, seed] : reveal.pair_seeds) (*out.mutable_pair_seeds())[id] = seed;
  return out;
}

absl::StatusOr<SecureRound::Result> SecureRound::Finish(const coordinator::v1::MaskReveals& m,
                                                        const tensor::FlatModel& base) {
  if (survivors_.empty() || !codec_) {
    return absl::FailedPreconditionError("secure round: this peer revealed nothing yet");
  }
  if (base.values.size() != own_masked_.size()) {
    return absl::InvalidArgumentError("secure round: the base model's size changed");
  }
  SHOAL_ASSIGN_OR_RETURN(privacy::secagg::MaskedSum sum,
                         privacy::secagg::MaskedSum::Start(masker_.masked_with(), survivors_,
                                                           own_masked_.size(), codec_->bits()));
  Result result;
  for (const std::string& id : survivors_) {
    if (id == masker_.self_id()) {
      SHOAL_RETURN_IF_ERROR(sum.AddMasked(id, own_masked_));
      result.num_samples += num_samples_;
    } else {
      auto it = held_.find(id);
      if (it == held_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("secure round: the masked update of survivor ", id, " is not held"));
      }
      SHOAL_RETURN_IF_ERROR(sum.AddMasked(id, it->second.masked));
      result.num_samples += it->second.num_samples;
    }
    auto seeds = m.seeds().find(id);
    if (seeds == m.seeds().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure round: no seeds of survivor ", id, " in the reveals"));
    }
    MaskReveal reveal;
    reveal.self_seed = seeds->second.self_seed();
    for (const auto& [peer, seed] : seeds->second.pair_seeds()) reveal.pair_seeds[peer] = seed;
    SHOAL_RETURN_IF_ERROR(sum.Unmask(id, reveal));
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint32_t> total, sum.Finish());
  SHOAL_ASSIGN_OR_RETURN(std::vector<float> mean,
                         privacy::secagg::ApplyMeanOfSum(
                             *codec_, total, static_cast<int>(survivors_.size()), base.values));
  result.model.layout = base.layout;
  result.model.values = std::move(mean);
  result.survivors = survivors_;
  return result;
}

}  // namespace shoal::peer
