#pragma once

// Signed peer announcements for DHT discovery: a peer signs "I am peer P of task T and my
// PeerService listens on A" with its TLS key (the tls.key of its --tls-dir) and attaches its
// certificate; a reader accepts the announcement only when the certificate chains to the task's
// CA (ca.crt), its common name is P and the signature verifies. A DHT participant without a
// certificate of that CA can store values under the task's key but cannot make a peer gossip
// with it. All cryptography is OpenSSL's (X.509 verification, EVP signatures).
//
// The format is SignedAnnouncement (protos/shoal/peer/v1/discovery.proto). Thread-safe: both
// classes are immutable after Create and cheap to copy.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shoal/peer/v1/discovery.pb.h"

struct evp_pkey_st;    // OpenSSL's EVP_PKEY
struct x509_store_st;  // OpenSSL's X509_STORE

namespace shoal::discovery {

// Larger values are refused before they are parsed (a certificate is about 1 KiB).
inline constexpr size_t kMaxSignedAnnouncementBytes = 16 * 1024;

// Signs announcements with one peer's key. The peer id is its certificate's common name.
class AnnouncementSigner {
 public:
  // `cert_pem`: the peer's certificate (the first of a chain); `key_pem`: its private key (EC,
  // RSA or Ed25519). Errors: INVALID_ARGUMENT when either does not parse, the key does not
  // belong to the certificate or the certificate has no common name.
  static absl::StatusOr<AnnouncementSigner> Create(absl::string_view cert_pem,
                                                   absl::string_view key_pem);

  const std::string& peer_id() const { return peer_id_; }

  // A serialized SignedAnnouncement of `announcement`. Errors: INVALID_ARGUMENT when the
  // announcement's peer_id is not this certificate's; INTERNAL if OpenSSL fails.
  absl::StatusOr<std::string> Sign(const peer::v1::PeerAnnouncement& announcement) const;

 private:
  std::shared_ptr<evp_pkey_st> key_;
  std::string certificate_der_;
  std::string peer_id_;
};

// Checks announcements against a CA.
class AnnouncementVerifier {
 public:
  // `ca_pem`: one or more trusted CA certificates. Errors: INVALID_ARGUMENT when none parses.
  static absl::StatusOr<AnnouncementVerifier> Create(absl::string_view ca_pem);

  // The announcement inside `signed_announcement` when it is for `task` and verifies (see the
  // file comment). Errors (the value is to be ignored): INVALID_ARGUMENT, with what is wrong:
  // too large, not a SignedAnnouncement, no or a bad signature, a certificate the CA did not
  // sign (or expired), a peer id other than the certificate's common name, another task, an
  // empty address.
  absl::StatusOr<peer::v1::PeerAnnouncement> Verify(absl::string_view signed_announcement,
                                                    absl::string_view task) const;

 private:
  std::shared_ptr<x509_store_st> store_;
};

}  // namespace shoal::discovery
