#include "libs/privacy/secagg/identity.h"

#include "absl/strings/str_cat.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/secagg/wire.h"

namespace shoal::privacy::secagg {

std::string SignedKeysMessage(absl::string_view round_id, absl::string_view participant_id,
                              absl::string_view encryption_public_key,
                              absl::string_view mask_public_key) {
  return Framed({"shoal.secagg.v1 advertised keys", round_id, participant_id, encryption_public_key,
                 mask_public_key});
}

std::string SignedSurvivorsMessage(absl::string_view round_id,
                                   const std::vector<std::string>& survivors) {
  std::string message = Framed({"shoal.secagg.v1 survivors", round_id});
  for (const std::string& id : survivors) message += Framed({id});
  return message;
}

absl::StatusOr<std::unique_ptr<Ed25519KeySigner>> Ed25519KeySigner::Create(
    absl::string_view private_key) {
  if (private_key.size() != kEd25519PrivateKeySize) {
    return absl::InvalidArgumentError(absl::StrCat("Ed25519 identity key: ", private_key.size(),
                                                   " bytes, expected ", kEd25519PrivateKeySize));
  }
  return std::unique_ptr<Ed25519KeySigner>(new Ed25519KeySigner(std::string(private_key)));
}

Ed25519KeySigner::~Ed25519KeySigner() { Scrub(private_key_); }

absl::StatusOr<std::string> Ed25519KeySigner::Sign(absl::string_view message) const {
  return Ed25519Sign(private_key_, message);
}

absl::StatusOr<std::unique_ptr<Ed25519KeyVerifier>> Ed25519KeyVerifier::Create(
    std::map<std::string, std::string> public_keys) {
  for (const auto& [id, key] : public_keys) {
    if (key.size() != kEd25519PublicKeySize) {
      return absl::InvalidArgumentError(absl::StrCat("Ed25519 identity key of \"", id,
                                                     "\": ", key.size(), " bytes, expected ",
                                                     kEd25519PublicKeySize));
    }
  }
  return std::unique_ptr<Ed25519KeyVerifier>(new Ed25519KeyVerifier(
      std::map<std::string, std::string, std::less<>>(public_keys.begin(), public_keys.end())));
}

absl::Status Ed25519KeyVerifier::Verify(absl::string_view participant_id, absl::string_view message,
                                        absl::string_view signature) const {
  auto it = public_keys_.find(participant_id);
  if (it == public_keys_.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat("no identity key is known for participant \"", participant_id, "\""));
  }
  if (absl::Status s = Ed25519Verify(it->second, message, signature); !s.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the signature of participant \"", participant_id, "\" does not verify: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace shoal::privacy::secagg
