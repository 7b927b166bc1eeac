#pragma once

// A peer's side of the federation's secure statistics (services/coordinator/secure_statistics.h):
// its moments, encoded in fixed point (libs/privacy/moments_codec.h), masked with the pairwise
// double masking of libs/privacy/secagg/pairwise_round.h among the participants the coordinator
// lists, so that the coordinator learns only the participants' sum. A fresh mask key per attempt;
// an attempt is unmasked at most once, and only ever by self-mask seeds (no pairwise seed is
// revealed: an attempt that loses a participant is abandoned). Not thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/data/feature_moments.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/pairwise_round.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

class SecureMoments {
 public:
  // Encodes `moments` for `bound` (privacy.secure_aggregation.feature_bound). Errors:
  // INVALID_ARGUMENT as MomentsCodec::Encode (a feature beyond the bound is named, with its name
  // from `feature_names` when given), or a null identity.
  static absl::StatusOr<SecureMoments> Create(
      std::string task, std::string self_id, const data::FeatureMoments& moments, double bound,
      std::shared_ptr<const privacy::secagg::KeySigner> identity,
      const std::vector<std::string>& feature_names = {});

  // Step 1 of `attempt`: a fresh mask key, signed.
  absl::StatusOr<coordinator::v1::SecureMoments> Advertise(uint32_t attempt);

  // The answer to a step of the coordinator (none to a step of another attempt). Errors:
  // INVALID_ARGUMENT / UNAUTHENTICATED a participant list this peer does not mask with
  // (PairwiseMasker::Mask), FAILED_PRECONDITION an unmask before the masking.
  absl::StatusOr<std::optional<coordinator::v1::SecureMoments>> Answer(
      const coordinator::v1::SecureStatistics& step);

 private:
  SecureMoments(std::string task, std::string self_id, size_t features,
                std::vector<uint32_t> encoded,
                std::shared_ptr<const privacy::secagg::KeySigner> identity)
      : task_(std::move(task)),
        self_id_(std::move(self_id)),
        features_(features),
        encoded_(std::move(encoded)),
        identity_(std::move(identity)) {}

  std::string task_;
  std::string self_id_;
  size_t features_;
  std::vector<uint32_t> encoded_;
  std::shared_ptr<const privacy::secagg::KeySigner> identity_;
  uint32_t attempt_ = 0;
  std::optional<privacy::secagg::PairwiseMasker> masker_;  // of attempt_
};

}  // namespace shoal::peer
