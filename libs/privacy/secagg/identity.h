#pragma once

// Binding a participant's advertised SecAgg keys to its identity, so that the aggregator that
// relays them cannot substitute keys of its own (and so read the shares, or unmask an input).
// The signed message is SignedKeysMessage: the round id, the participant id and both public keys,
// each length-prefixed after a fixed label. The same identity key signs the survivor list of the
// consistency check (SignedSurvivorsMessage). Where a participant's identity public key comes from
// (a certificate, the coordinator's registry) is the verifier's business: these are the interfaces
// at that boundary, and Ed25519 implementations of them.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal::privacy::secagg {

// The bytes a participant signs to advertise its keys for one round.
std::string SignedKeysMessage(absl::string_view round_id, absl::string_view participant_id,
                              absl::string_view encryption_public_key,
                              absl::string_view mask_public_key);

// The bytes a participant signs in the consistency check: the round id and the survivor list
// (sorted), each length-prefixed after a fixed label of its own, so that a signature of one kind
// is never one of the other.
std::string SignedSurvivorsMessage(absl::string_view round_id,
                                   const std::vector<std::string>& survivors);

// Signs with this participant's identity key.
class KeySigner {
 public:
  virtual ~KeySigner() = default;
  virtual absl::StatusOr<std::string> Sign(absl::string_view message) const = 0;
};

// Checks signatures against the identity keys of the participants.
class KeyVerifier {
 public:
  virtual ~KeyVerifier() = default;
  // OK when `signature` is `participant_id`'s signature of `message`. Errors: UNAUTHENTICATED when
  // the participant has no known identity key or the signature does not verify.
  virtual absl::Status Verify(absl::string_view participant_id, absl::string_view message,
                              absl::string_view signature) const = 0;
};

class Ed25519KeySigner final : public KeySigner {
 public:
  // `private_key`: the 32-byte Ed25519 seed (RFC 8032). Errors: INVALID_ARGUMENT on its size.
  static absl::StatusOr<std::unique_ptr<Ed25519KeySigner>> Create(absl::string_view private_key);
  ~Ed25519KeySigner() override;  // scrubs the key

  absl::StatusOr<std::string> Sign(absl::string_view message) const override;

 private:
  explicit Ed25519KeySigner(std::string private_key) : private_key_(std::move(private_key)) {}
  std::string private_key_;
};

class Ed25519KeyVerifier final : public KeyVerifier {
 public:
  // `public_keys`: participant id -> 32-byte Ed25519 public key. Errors: INVALID_ARGUMENT naming
  // the participant whose key has the wrong size.
  static absl::StatusOr<std::unique_ptr<Ed25519KeyVerifier>> Create(
      std::map<std::string, std::string> public_keys);

  absl::Status Verify(absl::string_view participant_id, absl::string_view message,
                      absl::string_view signature) const override;

 private:
  explicit Ed25519KeyVerifier(std::map<std::string, std::string, std::less<>> public_keys)
      : public_keys_(std::move(public_keys)) {}
  std::map<std::string, std::string, std::less<>> public_keys_;
};

}  // namespace shoal::privacy::secagg
