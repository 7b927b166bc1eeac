#pragma once

// One participant's side of a SecAgg+ round (the protocol: round.h). A state machine with one
// method per step, each taking what the aggregator sent and returning what to send back:
//   AdvertiseKeys() -> AdvertisedKeys
//   ShareKeys(KeyBundle) -> EncryptedShares
//   MaskInput(EncryptedShares, input) -> MaskedInput
//   SignSurvivors(ConsistencyCheckRequest) -> ConsistencyCheckResponse
//   Unmask(UnmaskRequest) -> UnmaskResponse
// Each step runs once and in this order. A step that is refused (out of turn, or on input that
// fails a check: a signature, a seal, a neighbourhood, the threshold) reveals nothing and ends
// the client's round: every later call fails with FAILED_PRECONDITION naming the first refusal.
// The client's secrets (key pairs, self-mask seed, held shares) are scrubbed when it is
// destroyed or done.
//
// Not thread-safe: one caller drives it (a peer's session serialises the steps anyway).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/round.h"
#include "shoal/privacy/v1/secagg.pb.h"

namespace shoal::privacy::secagg {

class SecAggClient {
 public:
  // Errors: INVALID_ARGUMENT on a bad config (SecAggRound::Create), a `self_id` that is not a
  // participant, or a null signer or verifier.
  static absl::StatusOr<std::unique_ptr<SecAggClient>> Create(
      const v1::SecAggConfig& config, std::string self_id, std::shared_ptr<const KeySigner> signer,
      std::shared_ptr<const KeyVerifier> verifier);
  ~SecAggClient();
  SecAggClient(const SecAggClient&) = delete;
  SecAggClient& operator=(const SecAggClient&) = delete;

  // Step 1: fresh key pairs, their public halves signed.
  absl::StatusOr<v1::AdvertisedKeys> AdvertiseKeys();

  // Step 2: checks each neighbour's keys (a participant's neighbour, listed once, its signature
  // verifies; UNAUTHENTICATED when not) and that at least threshold neighbours advertised
  // (FAILED_PRECONDITION), then returns one sealed share pair per neighbour.
  absl::StatusOr<v1::EncryptedShares> ShareKeys(const v1::KeyBundle& bundle);

  // Step 3: opens the shares sent to this participant (each from a neighbour of the key bundle,
  // once, addressed here, its seal intact), needs at least threshold of them
  // (FAILED_PRECONDITION), and masks `input` (vector_length ring elements) with its self mask
  // and a pairwise mask per neighbour that sent shares.
  absl::StatusOr<v1::MaskedInput> MaskInput(const v1::EncryptedShares& shares,
                                            absl::Span<const uint32_t> input);

  // Writes the input's ring elements [start, start + block.size()) to `block`; an error ends
  // the round. Each element is asked for once, in order, a block at a time.
  using InputBlocks = std::function<absl::Status(size_t start, absl::Span<uint32_t> block)>;

  // Step 3 as above, with the input written a block at a time by `input` (vector_length elements
  // in the ring; one outside it is refused, INVALID_ARGUMENT) and masked as it comes, straight
  // into the message's values: no copy of the whole input. The values are built in `buffer`,
  // whose memory is reused when it has the capacity (a buffer kept from an earlier round).
  absl::StatusOr<v1::MaskedInput> MaskInput(const v1::EncryptedShares& shares,
                                            const InputBlocks& input, std::string buffer = {});

  // Step 4, the consistency check: signs the survivor list, once. Refuses (INVALID_ARGUMENT) a
  // list that is not sorted and distinct, names someone not a participant, leaves this
  // participant out, or names a neighbour that sent it no shares; refuses (FAILED_PRECONDITION) a
  // list with fewer than threshold of this participant's neighbours.
  absl::StatusOr<v1::ConsistencyCheckResponse> SignSurvivors(
      const v1::ConsistencyCheckRequest& request);

  // Step 5: reveals the self-mask seed share of each survivor and the mask-key share of each
  // dropped neighbour, only once the request shows that the survivor list it signed is the one
  // the others signed: at least threshold signatures of that list from distinct survivors
  // (FAILED_PRECONDITION when fewer), each of which verifies (UNAUTHENTICATED when one does not:
  // forged, or over another list), and survivors and dropped neighbours exactly as the list
  // implies. Refuses (INVALID_ARGUMENT) a request naming a peer both ways or twice, a peer that
  // sent this participant no shares, or a survivor it did not sign for; refuses
  // (FAILED_PRECONDITION) one naming fewer survivors than the threshold.
  absl::StatusOr<v1::UnmaskResponse> Unmask(const v1::UnmaskRequest& request);

  const std::string& id() const { return self_id_; }

 private:
  enum class Step { kAdvertise, kShare, kMask, kSign, kUnmask, kDone, kRefused };

  SecAggClient(SecAggRound round, std::string self_id, std::shared_ptr<const KeySigner> signer,
               std::shared_ptr<const KeyVerifier> verifier);

  // OK when the client is at `step`; else FAILED_PRECONDITION (out of turn ends the round).
  absl::Status Begin(Step step, absl::string_view what);
  // Ends the round on `error` (scrubbing the secrets) and returns it.
  absl::Status Refuse(absl::Status error);
  // OK when `request` carries at least threshold valid signatures of the signed survivor list
  // and names survivors and dropped neighbours exactly as that list implies.
  absl::Status CheckConsistency(const v1::UnmaskRequest& request) const;
  // Step 3 once the input is checked: opens the shares, masks and packs.
  absl::StatusOr<v1::MaskedInput> MaskBlocks(const v1::EncryptedShares& shares,
                                             const InputBlocks& input, std::string buffer);
  // MaskInput's checks of the shares, which it then holds; FAILED_PRECONDITION below threshold.
  absl::Status OpenShares(const v1::EncryptedShares& shares);
  void ScrubSecrets();

  SecAggRound round_;
  std::string self_id_;
  std::shared_ptr<const KeySigner> signer_;
  std::shared_ptr<const KeyVerifier> verifier_;
  Step step_ = Step::kAdvertise;
  absl::Status refusal_;

  KeyPair encryption_keys_;
  KeyPair mask_keys_;
  std::string self_mask_seed_;
  // Neighbour -> its advertised keys, from the key bundle.
  std::map<std::string, v1::AdvertisedKeys, std::less<>> neighbour_keys_;
  // Neighbour that sent shares -> this participant's shares of its secrets.
  std::map<std::string, v1::SharePair, std::less<>> held_shares_;
  // The survivor list this participant signed in the consistency check.
  std::vector<std::string> signed_survivors_;
};

}  // namespace shoal::privacy::secagg
