#pragma once

// Secure aggregation in a decentralized round (privacy.secure_aggregation), at one participant:
// the pairwise double masking of libs/privacy/secagg/pairwise_round.h over the coordinator's
// PeerList. The protocol is in docs/explanation/decentralized.md.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/privacy/fixed_point.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/pairwise_round.h"
#include "libs/tensor/flat_model.h"
#include "services/peer_agent/update_privacy.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

// One participant's secure round: made once it trained (its delta against the round's base
// clipped to clip_norm); Mask at each PeerList (the update it serves as ROUND_UPDATE: masked,
// fixed point in Z_(2^32), laid out as MaskedLayout); Hold the others' masked updates as they
// arrive; Reveal once the coordinator fixed the survivors (Unmask); Finish with every
// survivor's seeds (MaskReveals): base + the exact sum of the survivors' clipped deltas / their
// number, the same bits at every participant. Not thread-safe.
class SecureRound {
 public:
  // `num_samples`: what this participant trained on. Errors: INVALID_ARGUMENT base and trained
  // of different layouts, clip_norm not > 0.
  static absl::StatusOr<SecureRound> Start(const std::string& task, uint64_t round,
                                           const std::string& self_id, double clip_norm,
                                           uint64_t num_samples, const tensor::FlatModel& base,
                                           const tensor::FlatModel& trained);

  // This round's mask key, signed with the identity key (RoundReady).
  absl::StatusOr<privacy::secagg::MaskKey> Advertise(
      const privacy::secagg::KeySigner& identity) const;

  // Masks over the participants of PeerList `attempt` (each with its identity and mask keys)
  // and forgets the masked updates held of an earlier masking. With `noise` enabled (privacy.dp
  // at level peer) the clipped update gets its noise for this masking's participants first, a
  // fresh draw at each masking (only one masking of a round is ever unmasked). Returns what to
  // serve. Errors: INVALID_ARGUMENT a participant without keys, or as PairwiseMasker::Mask.
  absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> Mask(
      uint32_t attempt, const std::vector<coordinator::v1::PeerEndpoint>& participants,
      UpdatePrivacy* noise = nullptr);

  // The participants of the current masking, ascending; empty before Mask.
  const std::vector<std::string>& masked_with() const { return masker_.masked_with(); }
  bool Holds(const std::string& peer_id) const { return held_.count(peer_id) > 0; }
  // Keeps `peer_id`'s masked update as fetched. Errors: INVALID_ARGUMENT not masked with, or a
  // layout other than MaskedLayout's.
  absl::Status Hold(const std::string& peer_id, const tensor::FlatModel& served,
                    uint64_t num_samples);

  // The seeds for Unmask (whose attempt may be later than the masking's: participants left
  // while sharing). Errors: as PairwiseMasker::Reveal (FAILED_PRECONDITION: refused).
  absl::StatusOr<coordinator::v1::SeedReveal> Reveal(const coordinator::v1::Unmask& m);

  struct Result {
    tensor::FlatModel model;
    std::vector<std::string> survivors;
    uint64_t num_samples = 0;
  };
  // Every survivor's masked update (held) and seeds: the round's model. Errors:
  // FAILED_PRECONDITION nothing revealed yet, or a survivor's masked update not held;
  // INVALID_ARGUMENT seeds that do not fit, or a sum that does not decode.
  absl::StatusOr<Result> Finish(const coordinator::v1::MaskReveals& m,
                                const tensor::FlatModel& base);

  // How a masked update of `elements` ring values travels (a FlatModel, as every snapshot): one
  // tensor "masked_update" of `elements` Element::kUint32 values (DTYPE_UINT32 on the wire), 4
  // bytes each, as many as the model's float32 values.
  static tensor::ModelLayout MaskedLayout(size_t elements);

 private:
  SecureRound(privacy::secagg::PairwiseMasker masker, double clip_norm, std::vector<float> delta,
              uint64_t num_samples);

  privacy::secagg::PairwiseMasker masker_;
  double clip_norm_;
  std::vector<float> delta_;                       // trained - base, unclipped
  uint64_t num_samples_;                           // this participant's
  std::optional<privacy::FixedPointCodec> codec_;  // of the current masking
  uint32_t mask_attempt_ = 0;                      // the PeerList attempt it was made for
  std::vector<uint32_t> own_masked_;
  struct Held {
    std::vector<uint32_t> masked;
    uint64_t num_samples = 0;
  };
  std::map<std::string, Held> held_;    // the others' masked updates of the current masking
  std::vector<std::string> survivors_;  // of the Reveal
};

}  // namespace shoal::peer
