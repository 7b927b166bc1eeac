#pragma once

// The cryptographic primitives of secure aggregation, each a thin wrapper over OpenSSL 3's EVP
// interfaces (nothing here implements a cipher):
//   X25519 (RFC 7748) key pairs and key agreement, and HKDF-SHA256 (RFC 5869) over the agreed
//     secret: two peers derive the same 32-byte seed for their pairwise mask;
//   the ChaCha20 keystream (RFC 8439), the generator that expands a seed into a mask;
//   ChaCha20-Poly1305 AEAD (RFC 8439), to seal Shamir shares sent peer to peer through a relay
//     that must not read or alter them;
//   Ed25519 (RFC 8032) signatures, to bind advertised keys to an identity.
//
// Keys, nonces, seeds and signatures are raw byte strings (std::string), as protobuf `bytes`
// fields carry them; every function checks their sizes. Private keys are plain strings: callers
// that keep them should scrub them (OPENSSL_cleanse) when done.
//
// Thread-safe: free functions without shared state (OpenSSL 3 is thread-safe).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

struct evp_cipher_ctx_st;  // OpenSSL's EVP_CIPHER_CTX

namespace shoal::privacy {

inline constexpr size_t kX25519KeySize = 32;
inline constexpr size_t kEd25519PrivateKeySize = 32;  // the RFC 8032 seed
inline constexpr size_t kEd25519PublicKeySize = 32;
inline constexpr size_t kEd25519SignatureSize = 64;
inline constexpr size_t kSharedSeedSize = 32;
inline constexpr size_t kChaCha20KeySize = 32;
inline constexpr size_t kChaCha20NonceSize = 12;
inline constexpr size_t kAeadKeySize = 32;
inline constexpr size_t kAeadNonceSize = 12;
inline constexpr size_t kAeadTagSize = 16;

// A private key and its public key, raw (RFC 7748 / RFC 8032 encodings).
struct KeyPair {
  std::string private_key;
  std::string public_key;
};

// `size` bytes from OpenSSL's CSPRNG. Errors: INTERNAL if it fails.
absl::StatusOr<std::string> RandomBytes(size_t size);

// --- X25519 and HKDF -------------------------------------------------------------------------

absl::StatusOr<KeyPair> GenerateX25519KeyPair();
// The key pair of a known private key (32 bytes): restoring a key from Shamir shares, or a test
// vector. Errors: INVALID_ARGUMENT on a wrong size.
absl::StatusOr<KeyPair> X25519KeyPairFromPrivateKey(absl::string_view private_key);
// The raw 32-byte X25519 shared secret. Errors: INVALID_ARGUMENT on a wrong key size, or a peer
// public key of small order (the result would be all zeros, which OpenSSL refuses).
absl::StatusOr<std::string> X25519SharedSecret(absl::string_view private_key,
                                               absl::string_view peer_public_key);
// HKDF-SHA256 (RFC 5869) through EVP_KDF "HKDF": `size` (1..8160) bytes from `key_material`
// (non-empty), an optional `salt` (empty: the RFC's zero salt) and `info` (context).
absl::StatusOr<std::string> HkdfSha256(absl::string_view key_material, absl::string_view salt,
                                       absl::string_view info, size_t size);
// The 32-byte seed two peers share: HKDF-SHA256(X25519(private, peer public), salt = empty,
// info = context). Both sides get the same seed; a different context (task, round, purpose)
// gives an independent one. Errors as X25519SharedSecret.
absl::StatusOr<std::string> DeriveSharedSeed(absl::string_view private_key,
                                             absl::string_view peer_public_key,
                                             absl::string_view context);

// --- ChaCha20 keystream ----------------------------------------------------------------------

// The ChaCha20 keystream (RFC 8439 §2.4) under a 32-byte key and 12-byte nonce from block
// `counter` on, produced in pieces of any size (EVP_chacha20 over zeros). Owned by one user;
// not thread-safe; movable.
class ChaCha20Stream {
 public:
  static absl::StatusOr<ChaCha20Stream> Create(absl::string_view key, absl::string_view nonce,
                                               uint32_t counter = 0);
  // The next out.size() bytes of keystream. Errors: INTERNAL if OpenSSL fails.
  absl::Status Next(absl::Span<uint8_t> out);

 private:
  struct CtxFree {
    void operator()(evp_cipher_ctx_st* ctx) const;
  };
  using Ctx = std::unique_ptr<evp_cipher_ctx_st, CtxFree>;
  explicit ChaCha20Stream(Ctx ctx) : ctx_(std::move(ctx)) {}
  Ctx ctx_;
};

// `size` bytes of keystream at once.
absl::StatusOr<std::string> ChaCha20Keystream(absl::string_view key, absl::string_view nonce,
                                              uint32_t counter, size_t size);

// --- ChaCha20-Poly1305 AEAD ------------------------------------------------------------------

// ciphertext || 16-byte tag of `plaintext`, authenticating `associated_data` too. A (key, nonce)
// pair must never seal two messages. Errors: INVALID_ARGUMENT on a key or nonce size.
absl::StatusOr<std::string> AeadSeal(absl::string_view key, absl::string_view nonce,
                                     absl::string_view plaintext,
                                     absl::string_view associated_data);
// The plaintext of AeadSeal's output. Errors: INVALID_ARGUMENT on sizes, and when the tag does not
// verify (the message, nonce or associated data were altered, or the key is wrong): nothing of
// the plaintext is returned then.
absl::StatusOr<std::string> AeadOpen(absl::string_view key, absl::string_view nonce,
                                     absl::string_view sealed, absl::string_view associated_data);
// nonce || AeadSeal(...) with a fresh random 12-byte nonce: the safe default when a key seals
// more than one message (random nonces collide with probability ~ m² / 2^97 over m messages).
absl::StatusOr<std::string> AeadSealRandomNonce(absl::string_view key, absl::string_view plaintext,
                                                absl::string_view associated_data);
// Opens AeadSealRandomNonce's output. Errors as AeadOpen.
absl::StatusOr<std::string> AeadOpenPrefixedNonce(absl::string_view key, absl::string_view message,
                                                  absl::string_view associated_data);

// --- Ed25519 ---------------------------------------------------------------------------------

absl::StatusOr<KeyPair> GenerateEd25519KeyPair();
// The key pair of a known 32-byte private key (RFC 8032 seed). Errors: INVALID_ARGUMENT on size.
absl::StatusOr<KeyPair> Ed25519KeyPairFromPrivateKey(absl::string_view private_key);
// The 64-byte signature of `message`. Errors: INVALID_ARGUMENT on a key size.
absl::StatusOr<std::string> Ed25519Sign(absl::string_view private_key, absl::string_view message);
// OK when `signature` is `public_key`'s signature of `message`. Errors: INVALID_ARGUMENT on
// sizes, or when it does not verify.
absl::Status Ed25519Verify(absl::string_view public_key, absl::string_view message,
                           absl::string_view signature);

}  // namespace shoal::privacy
