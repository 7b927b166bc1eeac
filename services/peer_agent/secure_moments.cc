#include "services/peer_agent/secure_moments.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/moments_codec.h"

namespace shoal::peer {

using coordinator::v1::SecureStatistics;
using privacy::secagg::MaskKey;

absl::StatusOr<SecureMoments> SecureMoments::Create(
    std::string task, std::string self_id, const data::FeatureMoments& moments, double bound,
    std::shared_ptr<const privacy::secagg::KeySigner> identity,
    const std::vector<std::string>& feature_names) {
  if (identity == nullptr) {
    return absl::InvalidArgumentError("secure statistics: this peer has no identity key");
  }
  SHOAL_ASSIGN_OR_RETURN(const privacy::MomentsCodec codec,
                         privacy::MomentsCodec::Create(moments.sum.size(), bound));
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint32_t> encoded, codec.Encode(moments, feature_names));
  return SecureMoments(std::move(task), std::move(self_id), moments.sum.size(), std::move(encoded),
                       std::move(identity));
}

absl::StatusOr<coordinator::v1::SecureMoments> SecureMoments::Advertise(uint32_t attempt) {
  SHOAL_ASSIGN_OR_RETURN(privacy::secagg::PairwiseMasker masker,
                         privacy::secagg::PairwiseMasker::Create(
                             absl::StrCat("statistics/", task_, "/", attempt), self_id_));
  SHOAL_ASSIGN_OR_RETURN(const MaskKey key, masker.Advertise(*identity_));
  masker_.emplace(std::move(masker));
  attempt_ = attempt;
  coordinator::v1::SecureMoments out;
  out.set_attempt(attempt);
  out.mutable_key()->set_features(static_cast<uint32_t>(features_));
  out.mutable_key()->set_mask_public_key(key.public_key);
  out.mutable_key()->set_mask_key_signature(key.signature);
  return out;
}

absl::StatusOr<std::optional<coordinator::v1::SecureMoments>> SecureMoments::Answer(
    const SecureStatistics& step) {
  if (step.has_restart()) {
    if (step.attempt() <= attempt_) return std::nullopt;
    SHOAL_ASSIGN_OR_RETURN(coordinator::v1::SecureMoments key, Advertise(step.attempt()));
    return key;
  }
  if (step.attempt() != attempt_ || !masker_.has_value()) return std::nullopt;
  coordinator::v1::SecureMoments out;
  out.set_attempt(attempt_);
  if (step.has_participants()) {
    std::map<std::string, MaskKey> keys;
    std::map<std::string, std::string> identities;
    for (const coordinator::v1::PeerEndpoint& p : step.participants().participants()) {
      keys[p.peer_id()] = MaskKey{p.mask_public_key(), p.mask_key_signature()};
      identities[p.peer_id()] = p.identity_public_key();
    }
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<privacy::secagg::Ed25519KeyVerifier> verifier,
                           privacy::secagg::Ed25519KeyVerifier::Create(std::move(identities)));
    SHOAL_ASSIGN_OR_RETURN(const std::vector<uint32_t> masked,
                           masker_->Mask(attempt_, keys, *verifier, encoded_, 32));
    std::string& bytes = *out.mutable_masked();
    bytes.resize(4 * masked.size());
    for (size_t i = 0; i < masked.size(); ++i) {
      for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>(masked[i] >> (8 * b));
    }
    return out;
  }
  if (step.has_unmask()) {
    // Every participant survives: only the self-mask seed is revealed, never a pairwise one.
    SHOAL_ASSIGN_OR_RETURN(const privacy::secagg::MaskReveal reveal,
                           masker_->Reveal(attempt_, masker_->masked_with()));
    out.set_self_seed(reveal.self_seed);
    return out;
  }
  return absl::InvalidArgumentError("secure statistics: a step without content");
}

}  // namespace shoal::peer
