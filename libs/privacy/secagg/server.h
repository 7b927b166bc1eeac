#pragma once

// The aggregator's side of a SecAgg+ round (the protocol: round.h). A state machine in five
// steps; in each, Add* takes one participant's message (a gRPC handler passes it on after checking
// that the caller is who the message names) and Close* ends the step, counts everyone who sent
// nothing valid as dropped, and returns the messages to send on, one per participant still in
// the round:
//   AddAdvertisedKeys ... CloseAdvertising -> KeyBundle per participant
//   AddShares ... CloseSharing -> EncryptedShares per participant (relayed unread)
//   AddMaskedInput ... CloseMasking -> ConsistencyCheckRequest per survivor (the survivor list)
//   AddSurvivorSignature ... CloseConsistencyCheck -> UnmaskRequest per survivor that signed
//   AddUnmaskResponse ... CloseUnmasking -> the sum of the survivors' inputs
// Add* refuses a bad message (INVALID_ARGUMENT, or UNAUTHENTICATED for a signature, naming the
// participant and what is wrong; ALREADY_EXISTS for a second message; FAILED_PRECONDITION out of
// turn) and the round goes on without it. Close* fails the round with FAILED_PRECONDITION when
// the dropouts leave a participant fewer than threshold neighbours, the survivor list fewer than
// threshold signatures, or a secret fewer than threshold shares: it never returns a wrong sum. A
// survivor that does not sign the list stays in the sum (its masks are removed as a survivor's)
// but is not asked to unmask. After a failure every call returns it.
//
// Not thread-safe: the caller serialises the calls (one mutex in the session that owns it).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/round.h"
#include "libs/privacy/shamir.h"
#include "shoal/privacy/v1/secagg.pb.h"

namespace shoal::privacy::secagg {

class SecAggServer {
 public:
  // Errors: INVALID_ARGUMENT on a bad config (SecAggRound::Create) or a null verifier.
  // `sum_buffer`: memory for the running sum (any contents; an earlier round's sum, so that its
  // pages are not faulted in again); the sum starts at zero either way.
  static absl::StatusOr<std::unique_ptr<SecAggServer>> Create(
      const v1::SecAggConfig& config, std::shared_ptr<const KeyVerifier> verifier,
      std::vector<uint32_t> sum_buffer = {});

  // Step 1. Checks the key sizes and the signature, so a bad key never reaches the others.
  absl::Status AddAdvertisedKeys(const v1::AdvertisedKeys& keys);
  absl::StatusOr<std::map<std::string, v1::KeyBundle>> CloseAdvertising();

  // Step 2. One message per sender: a share for each of its neighbours that advertised keys.
  absl::Status AddShares(const v1::EncryptedShares& shares);
  absl::StatusOr<std::map<std::string, v1::EncryptedShares>> CloseSharing();

  // Step 3. Folds the masked input into the running sum (AddPackedRingValues).
  absl::Status AddMaskedInput(const v1::MaskedInput& input);
  // Step 3 a chunk at a time, for an input sent in several messages: `values` are the next packed
  // ring values of `id`'s input, checked and folded into the running sum as they come, with no
  // copy of the whole input. Returns true once the input is whole (it then counts as
  // AddMaskedInput's), false while more is owed. The chunks of an input not yet whole are held,
  // unread, until it is, so that one that never completes comes back out of the sum exactly:
  // AbandonMaskedInput (the sender left), a refused chunk (past the vector's length, or a value
  // outside the ring: INVALID_ARGUMENT, and the earlier chunks come out), or CloseMasking for
  // any input still incomplete. The sum is bit for bit what AddMaskedInput gives for the inputs
  // that completed. Errors as AddMaskedInput's.
  absl::StatusOr<bool> AddMaskedChunk(const std::string& id, std::string values);
  // Takes the chunks of `id`'s incomplete input back out of the sum; no-op when there are none.
  void AbandonMaskedInput(absl::string_view id);
  absl::StatusOr<std::map<std::string, v1::ConsistencyCheckRequest>> CloseMasking();

  // Step 4, the consistency check. A survivor's signature of the survivor list (checked here, so
  // that every signature relayed verifies).
  absl::Status AddSurvivorSignature(const v1::ConsistencyCheckResponse& signature);
  // FAILED_PRECONDITION when fewer than threshold survivors signed, or the signers leave a
  // participant fewer than threshold neighbours to unmask with. The unmask requests carry every
  // signature.
  absl::StatusOr<std::map<std::string, v1::UnmaskRequest>> CloseConsistencyCheck();

  // Step 5. Each response must reveal exactly what its request asked for, with the share index
  // the responder holds.
  absl::Status AddUnmaskResponse(const v1::UnmaskResponse& response);
  // The ring sum of the survivors' inputs (vector_length values).
  absl::StatusOr<std::vector<uint32_t>> CloseUnmasking();

  // The participants whose inputs are in the sum (sorted), once CloseMasking succeeded: the
  // number of summands to decode the sum with.
  const std::vector<std::string>& survivors() const { return survivors_; }

 private:
  enum class Step { kAdvertising, kSharing, kMasking, kConsistency, kUnmasking, kDone, kFailed };
  using IdSet = std::set<std::string, std::less<>>;

  SecAggServer(SecAggRound round, std::shared_ptr<const KeyVerifier> verifier,
               std::vector<uint32_t> sum_buffer);

  absl::Status Expect(Step step, absl::string_view what) const;
  absl::Status Fail(absl::Status error);
  // FAILED_PRECONDITION unless each of `members` has at least threshold neighbours in `live`.
  absl::Status CheckNeighbourhoods(const IdSet& members, const IdSet& live,
                                   absl::string_view stage) const;
  // The index of the share `holder` holds of `owner`'s secrets: its place among the owner's
  // neighbours that advertised keys, from 1.
  uint32_t ShareIndex(absl::string_view owner, absl::string_view holder) const;
  // Reconstructs a secret from the revealed shares of `owner`, or fails the round.
  absl::StatusOr<std::string> Reconstruct(
      const std::map<std::string, std::vector<ShamirShare>, std::less<>>& revealed,
      const std::string& owner, absl::string_view what);

  SecAggRound round_;
  std::shared_ptr<const KeyVerifier> verifier_;
  Step step_ = Step::kAdvertising;
  absl::Status failure_;

  std::map<std::string, v1::AdvertisedKeys, std::less<>> keys_;     // who advertised
  std::map<std::string, v1::EncryptedShares, std::less<>> shares_;  // who shared
  IdSet masked_;                                                    // who sent a masked input
  // An input still coming in chunks: how many of its values are folded, and the chunks folded.
  struct PartialInput {
    size_t values = 0;
    std::vector<std::string> chunks;
  };
  std::map<std::string, PartialInput, std::less<>> partial_;  // by sender
  std::vector<uint32_t> sum_;
  std::vector<std::string> survivors_;
  std::map<std::string, std::string, std::less<>> survivor_signatures_;  // by signer
  std::map<std::string, v1::UnmaskRequest, std::less<>> requests_;
  IdSet responded_;
  std::map<std::string, std::vector<ShamirShare>, std::less<>> seed_shares_;  // by owner
  std::map<std::string, std::vector<ShamirShare>, std::less<>> key_shares_;   // by owner
};

}  // namespace shoal::privacy::secagg
