#pragma once

// Secure aggregation among peers that exchange their updates directly (no aggregator, no
// Shamir shares): double masking where every survivor is alive to reveal its own seeds.
//
// Participant i of a round makes an X25519 key pair and advertises its public key signed with
// its identity key (MaskKeyMessage), so nobody can substitute keys. Given the round's
// participants P (the same list with the same keys at everyone), it masks its fixed-point
// encoded update x_i in Z_(2^k):
//   y_i = x_i + PRG(b_i) + sum_{j in P, j != i} ±PRG(s_ij)
// with b_i a fresh random self seed and s_ij = HKDF(X25519(i, j), round, attempt, i, j) (the
// lower id adds, the higher subtracts: masks.h), and serves y_i. A peer that fetches y_i learns
// nothing about x_i from it alone. Once the set S of participants whose masked updates make the
// round is fixed (one list for everyone), each i in S reveals b_i and, for each j in P \ S (left
// or unreachable after masking), s_ij; then anyone holding every y_i and every reveal of S
// computes sum_{i in S} x_i exactly (MaskedSum). A participant reveals only for one S per masking:
// never both kinds of seed for one peer (b_j and all of j's pairwise seeds would unmask y_j).
//
// Not thread-safe; one object per participant and round.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/privacy/secagg/identity.h"

namespace shoal::privacy::secagg {

// A participant's advertised mask key for a round: its X25519 public key and the identity key's
// signature of MaskKeyMessage.
struct MaskKey {
  std::string public_key;
  std::string signature;
};

// What a participant reveals once S is fixed: its self seed and its pairwise seeds with the
// participants of the masking that are not in S (by peer id).
struct MaskReveal {
  std::string self_seed;
  std::map<std::string, std::string> pair_seeds;
};

// The bytes participant `participant_id` signs to advertise `public_key` for `round_id` (a
// label of its own: a federated SecAgg signature never verifies as one of these).
std::string MaskKeyMessage(absl::string_view round_id, absl::string_view participant_id,
                           absl::string_view public_key);

// Participant `self_id`'s side of one round `round_id` (unique per task and round, e.g.
// "TASK/ROUND").
class PairwiseMasker {
 public:
  // Makes the round's X25519 key pair. Errors: INVALID_ARGUMENT an empty id; INTERNAL if OpenSSL
  // fails.
  static absl::StatusOr<PairwiseMasker> Create(std::string round_id, std::string self_id);
  ~PairwiseMasker();  // scrubs the private key and seeds
  PairwiseMasker(PairwiseMasker&&) = default;
  PairwiseMasker& operator=(PairwiseMasker&&) = default;

  // The public key, signed by `signer` (this participant's identity key).
  absl::StatusOr<MaskKey> Advertise(const KeySigner& signer) const;

  // y = `encoded` + PRG(b) + the pairwise masks with every other participant in
  // `participants` (peer id -> its advertised key, this participant's included), in Z_(2^bits).
  // `attempt` tells apart maskings of one round over different participant lists: each draws a
  // fresh self seed and pairwise seeds of its own. A new masking replaces the previous one,
  // until the first Reveal. Errors: INVALID_ARGUMENT this participant is not listed or listed
  // with another key, fewer than 2 participants, bits out of 1..32; UNAUTHENTICATED a
  // participant's signature does not verify against `verifier`; FAILED_PRECONDITION this round
  // already revealed.
  absl::StatusOr<std::vector<uint32_t>> Mask(uint32_t attempt,
                                             const std::map<std::string, MaskKey>& participants,
                                             const KeyVerifier& verifier,
                                             absl::Span<const uint32_t> encoded, int bits);

  // The seeds to reveal for masking `attempt` once `survivors` (S) is fixed: b and the pairwise
  // seeds with the masked participants not in S. The first call commits S; a later call must
  // name the same S. Errors: FAILED_PRECONDITION no masking of `attempt`, this participant not
  // in S (it reveals nothing, its b stays secret), or another S than the one committed (a peer
  // told in S keeps its pairwise seeds; a peer told out never gets b back); INVALID_ARGUMENT a
  // survivor that was not masked with, or a duplicate.
  absl::StatusOr<MaskReveal> Reveal(uint32_t attempt, const std::vector<std::string>& survivors);

  const std::string& self_id() const { return self_id_; }
  // The participants of the current masking, ascending (empty before Mask).
  const std::vector<std::string>& masked_with() const { return masked_with_; }

 private:
  PairwiseMasker(std::string round_id, std::string self_id, std::string private_key,
                 std::string public_key);

  std::string round_id_;
  std::string self_id_;
  std::string private_key_;
  std::string public_key_;
  // The current masking.
  bool masked_ = false;
  uint32_t attempt_ = 0;
  std::vector<std::string> masked_with_;           // ascending, self included
  std::string self_seed_;                          // b
  std::map<std::string, std::string> pair_seeds_;  // s_ij by j
  std::vector<std::string> committed_;             // S of the first Reveal, ascending
};

// The exact ring sum of the masked updates of S, after the masking over P (both ascending,
// S a subset of P with at least one member). Add each member's masked update and reveal in any
// order; the result is the same bits whatever the order. Not thread-safe.
class MaskedSum {
 public:
  // Errors: INVALID_ARGUMENT S empty or not a subset of P, duplicates, bits out of 1..32.
  static absl::StatusOr<MaskedSum> Start(std::vector<std::string> masked_with,
                                         std::vector<std::string> survivors, size_t size, int bits);

  // Folds survivor `peer_id`'s masked update. Errors: INVALID_ARGUMENT not a survivor, given
  // before, or of another size.
  absl::Status AddMasked(const std::string& peer_id, absl::Span<const uint32_t> masked);
  // Removes survivor `peer_id`'s self mask and its masks with the dropped participants.
  // Errors: INVALID_ARGUMENT not a survivor, given before, a seed of the wrong size, or pairwise
  // seeds for other peers than exactly the dropped ones (named).
  absl::Status Unmask(const std::string& peer_id, const MaskReveal& reveal);

  // Every survivor's masked update and reveal is in.
  bool complete() const;
  // sum_{i in S} x_i mod 2^bits. Errors: FAILED_PRECONDITION naming what is missing.
  absl::StatusOr<std::vector<uint32_t>> Finish() const;

  const std::vector<std::string>& survivors() const { return survivors_; }

 private:
  MaskedSum(std::vector<std::string> masked_with, std::vector<std::string> survivors,
            std::vector<std::string> dropped, size_t size, int bits);
  bool IsSurvivor(const std::string& peer_id) const;

  std::vector<std::string> masked_with_;  // P
  std::vector<std::string> survivors_;    // S
  std::vector<std::string> dropped_;      // P \ S
  int bits_;
  std::vector<uint32_t> sum_;
  std::map<std::string, bool> added_;     // by survivor
  std::map<std::string, bool> unmasked_;  // by survivor
};

}  // namespace shoal::privacy::secagg
