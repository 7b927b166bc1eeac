#include "libs/privacy/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::privacy {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct KdfFree {
  void operator()(EVP_KDF* p) const { EVP_KDF_free(p); }
};
struct KdfCtxFree {
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

const unsigned char* Bytes(absl::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* Bytes(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

// `what` with OpenSSL's first queued reason; empties the thread's error queue so that a failure
// here never surfaces in an unrelated later OpenSSL call.
absl::Status OpenSslError(absl::StatusCode code, absl::string_view what) {
  std::string reason;
  while (unsigned long e = ERR_get_error()) {
    if (reason.empty()) {
      char buf[256];
      ERR_error_string_n(e, buf, sizeof(buf));
      reason = buf;
    }
  }
  return absl::Status(code, reason.empty() ? std::string(what) : absl::StrCat(what, ": ", reason));
}

absl::Status Internal(absl::string_view what) {
  return OpenSslError(absl::StatusCode::kInternal, what);
}

absl::Status CheckSize(absl::string_view name, absl::string_view value, size_t size) {
  if (value.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be ", size, " bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RawPublicKey(EVP_PKEY* key, size_t size) {
  std::string out(size, '\0');
  size_t len = size;
  if (EVP_PKEY_get_raw_public_key(key, Bytes(out), &len) != 1 || len != size) {
    return Internal("OpenSSL: cannot read a raw public key");
  }
  return out;
}

absl::StatusOr<std::string> RawPrivateKey(EVP_PKEY* key, size_t size) {
  std::string out(size, '\0');
  size_t len = size;
  if (EVP_PKEY_get_raw_private_key(key, Bytes(out), &len) != 1 || len != size) {
    return Internal("OpenSSL: cannot read a raw private key");
  }
  return out;
}

absl::StatusOr<KeyPair> Generate(int type, absl::string_view name, size_t size) {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(type, nullptr));
  EVP_PKEY* raw = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    return Internal(absl::StrCat("OpenSSL: ", name, " key generation failed"));
  }
  Pkey key(raw);
  KeyPair pair;
  absl::StatusOr<std::string> priv = RawPrivateKey(key.get(), size);
  if (!priv.ok()) return priv.status();
  absl::StatusOr<std::string> pub = RawPublicKey(key.get(), size);
  if (!pub.ok()) return pub.status();
  pair.private_key = *std::move(priv);
  pair.public_key = *std::move(pub);
  return pair;
}

absl::StatusOr<Pkey> PrivateKey(int type, absl::string_view name, absl::string_view bytes) {
  if (absl::Status s = CheckSize(absl::StrCat(name, " private key"), bytes, 32); !s.ok()) {
    return s;
  }
  Pkey key(EVP_PKEY_new_raw_private_key(type, nullptr, Bytes(bytes), bytes.size()));
  if (key == nullptr) return Internal(absl::StrCat("OpenSSL: cannot load an ", name, " key"));
  return key;
}

absl::StatusOr<Pkey> PublicKey(int type, absl::string_view name, absl::string_view bytes) {
  if (absl::Status s = CheckSize(absl::StrCat(name, " public key"), bytes, 32); !s.ok()) {
    return s;
  }
  Pkey key(EVP_PKEY_new_raw_public_key(type, nullptr, Bytes(bytes), bytes.size()));
  if (key == nullptr) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat("not a valid ", name, " public key"));
  }
  return key;
}

absl::StatusOr<KeyPair> PairFromPrivate(int type, absl::string_view name,
                                        absl::string_view private_key) {
  absl::StatusOr<Pkey> key = PrivateKey(type, name, private_key);
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> pub = RawPublicKey(key->get(), 32);
  if (!pub.ok()) return pub.status();
  return KeyPair{std::string(private_key), *std::move(pub)};
}

// Runs EVP_*Update over `in` in pieces that fit its int length.
template <typename Update>
bool UpdateAll(EVP_CIPHER_CTX* ctx, Update update, const unsigned char* in, unsigned char* out,
               size_t size) {
  size_t done = 0;
  while (done < size) {
    const int piece = static_cast<int>(std::min<size_t>(size - done, INT_MAX / 2));
    int written = 0;
    if (update(ctx, out == nullptr ? nullptr : out + done, &written, in + done, piece) != 1) {
      return false;
    }
    // A stream cipher writes as much as it reads (with no output, `in` is associated data).
    if (out != nullptr && written != piece) return false;
    done += static_cast<size_t>(piece);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t size) {
  std::string out(size, '\0');
  for (size_t done = 0; done < size;) {
    const int piece = static_cast<int>(std::min<size_t>(size - done, INT_MAX / 2));
    if (RAND_bytes(Bytes(out) + done, piece) != 1) return Internal("OpenSSL RAND_bytes failed");
    done += static_cast<size_t>(piece);
  }
  return out;
}

// --- X25519 and HKDF -------------------------------------------------------------------------

absl::StatusOr<KeyPair> GenerateX25519KeyPair() {
  return Generate(EVP_PKEY_X25519, "X25519", kX25519KeySize);
}

absl::StatusOr<KeyPair> X25519KeyPairFromPrivateKey(absl::string_view private_key) {
  return PairFromPrivate(EVP_PKEY_X25519, "X25519", private_key);
}

absl::StatusOr<std::string> X25519SharedSecret(absl::string_view private_key,
                                               absl::string_view peer_public_key) {
  absl::StatusOr<Pkey> own = PrivateKey(EVP_PKEY_X25519, "X25519", private_key);
  if (!own.ok()) return own.status();
  absl::StatusOr<Pkey> peer = PublicKey(EVP_PKEY_X25519, "X25519", peer_public_key);
  if (!peer.ok()) return peer.status();
  PkeyCtx ctx(EVP_PKEY_CTX_new(own->get(), nullptr));
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) != 1) {
    return Internal("OpenSSL: cannot start an X25519 key agreement");
  }
  if (EVP_PKEY_derive_set_peer(ctx.get(), peer->get()) != 1) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        "X25519: the peer's public key is refused");
  }
  std::string secret(kX25519KeySize, '\0');
  size_t len = secret.size();
  if (EVP_PKEY_derive(ctx.get(), Bytes(secret), &len) != 1 || len != kX25519KeySize) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        "X25519 key agreement failed (the peer's public key is a small-order "
                        "point, which would give an all-zero secret)");
  }
  return secret;
}

absl::StatusOr<std::string> HkdfSha256(absl::string_view key_material, absl::string_view salt,
                                       absl::string_view info, size_t size) {
  if (key_material.empty()) return absl::InvalidArgumentError("HKDF: empty key material");
  if (size == 0 || size > size_t{255} * 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("HKDF-SHA256 output must be 1 to 8160 bytes, got ", size));
  }
  std::unique_ptr<EVP_KDF, KdfFree> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (kdf == nullptr) return Internal("OpenSSL: HKDF is not available");
  std::unique_ptr<EVP_KDF_CTX, KdfCtxFree> ctx(EVP_KDF_CTX_new(kdf.get()));
  if (ctx == nullptr) return Internal("OpenSSL: cannot create an HKDF context");
  char digest[] = "SHA256";
  OSSL_PARAM params[5];
  OSSL_PARAM* p = params;
  *p++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
  *p++ = OSSL_PARAM_construct_octet_string(
      OSSL_KDF_PARAM_KEY, const_cast<char*>(key_material.data()), key_material.size());
  // An absent salt is the RFC's string of zeros; an absent info is the empty context.
  if (!salt.empty()) {
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()),
                                             salt.size());
  }
  if (!info.empty()) {
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()),
                                             info.size());
  }
  *p = OSSL_PARAM_construct_end();
  std::string out(size, '\0');
  if (EVP_KDF_derive(ctx.get(), Bytes(out), out.size(), params) != 1) {
    return Internal("OpenSSL: HKDF-SHA256 failed");
  }
  return out;
}

absl::StatusOr<std::string> DeriveSharedSeed(absl::string_view private_key,
                                             absl::string_view peer_public_key,
                                             absl::string_view context) {
  absl::StatusOr<std::string> secret = X25519SharedSecret(private_key, peer_public_key);
  if (!secret.ok()) return secret.status();
  absl::StatusOr<std::string> seed = HkdfSha256(*secret, "", context, kSharedSeedSize);
  OPENSSL_cleanse(secret->data(), secret->size());
  return seed;
}

// --- ChaCha20 keystream ----------------------------------------------------------------------

void ChaCha20Stream::CtxFree::operator()(evp_cipher_ctx_st* ctx) const { EVP_CIPHER_CTX_free(ctx); }

absl::StatusOr<ChaCha20Stream> ChaCha20Stream::Create(absl::string_view key,
                                                      absl::string_view nonce, uint32_t counter) {
  if (absl::Status s = CheckSize("ChaCha20 key", key, kChaCha20KeySize); !s.ok()) return s;
  if (absl::Status s = CheckSize("ChaCha20 nonce", nonce, kChaCha20NonceSize); !s.ok()) return s;
  // OpenSSL's 16-byte ChaCha20 "IV" is the 32-bit block counter, little-endian, then the nonce.
  unsigned char iv[16];
  for (int i = 0; i < 4; ++i) iv[i] = static_cast<unsigned char>((counter >> (8 * i)) & 0xff);
  std::copy(nonce.begin(), nonce.end(), iv + 4);
  Ctx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_chacha20(), nullptr, Bytes(key), iv) != 1) {
    return Internal("OpenSSL: cannot start ChaCha20");
  }
  return ChaCha20Stream(std::move(ctx));
}

absl::Status ChaCha20Stream::Next(absl::Span<uint8_t> out) {
  // The keystream is the encryption of zeros, read from one constant block of them.
  static constexpr unsigned char kZeros[16384] = {};
  for (size_t done = 0; done < out.size();) {
    const size_t piece = std::min(out.size() - done, sizeof(kZeros));
    if (!UpdateAll(ctx_.get(), EVP_EncryptUpdate, kZeros, out.data() + done, piece)) {
      return Internal("OpenSSL: ChaCha20 failed");
    }
    done += piece;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChaCha20Keystream(absl::string_view key, absl::string_view nonce,
                                              uint32_t counter, size_t size) {
  absl::StatusOr<ChaCha20Stream> stream = ChaCha20Stream::Create(key, nonce, counter);
  if (!stream.ok()) return stream.status();
  std::string out(size, '\0');
  absl::Status s = stream->Next(absl::MakeSpan(Bytes(out), out.size()));
  if (!s.ok()) return s;
  return out;
}

// --- ChaCha20-Poly1305 AEAD ------------------------------------------------------------------

absl::StatusOr<std::string> AeadSeal(absl::string_view key, absl::string_view nonce,
                                     absl::string_view plaintext,
                                     absl::string_view associated_data) {
  if (absl::Status s = CheckSize("ChaCha20-Poly1305 key", key, kAeadKeySize); !s.ok()) return s;
  if (absl::Status s = CheckSize("ChaCha20-Poly1305 nonce", nonce, kAeadNonceSize); !s.ok()) {
    return s;
  }
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr || EVP_EncryptInit_ex(ctx.get(), EVP_chacha20_poly1305(), nullptr, Bytes(key),
                                           Bytes(nonce)) != 1) {
    return Internal("OpenSSL: cannot start ChaCha20-Poly1305");
  }
  std::string out(plaintext.size() + kAeadTagSize, '\0');
  int final_len = 0;
  if (!UpdateAll(ctx.get(), EVP_EncryptUpdate, Bytes(associated_data), nullptr,
                 associated_data.size()) ||
      !UpdateAll(ctx.get(), EVP_EncryptUpdate, Bytes(plaintext), Bytes(out), plaintext.size()) ||
      EVP_EncryptFinal_ex(ctx.get(), Bytes(out) + plaintext.size(), &final_len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kAeadTagSize),
                          Bytes(out) + plaintext.size()) != 1) {
    return Internal("OpenSSL: ChaCha20-Poly1305 sealing failed");
  }
  return out;
}

absl::StatusOr<std::string> AeadOpen(absl::string_view key, absl::string_view nonce,
                                     absl::string_view sealed, absl::string_view associated_data) {
  if (absl::Status s = CheckSize("ChaCha20-Poly1305 key", key, kAeadKeySize); !s.ok()) return s;
  if (absl::Status s = CheckSize("ChaCha20-Poly1305 nonce", nonce, kAeadNonceSize); !s.ok()) {
    return s;
  }
  if (sealed.size() < kAeadTagSize) {
    return absl::InvalidArgumentError(absl::StrCat("ChaCha20-Poly1305: sealed message of ",
                                                   sealed.size(), " bytes is shorter than its ",
                                                   kAeadTagSize, "-byte tag"));
  }
  const size_t size = sealed.size() - kAeadTagSize;
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr || EVP_DecryptInit_ex(ctx.get(), EVP_chacha20_poly1305(), nullptr, Bytes(key),
                                           Bytes(nonce)) != 1) {
    return Internal("OpenSSL: cannot start ChaCha20-Poly1305");
  }
  std::string tag(sealed.substr(size));
  std::string out(size, '\0');
  int final_len = 0;
  if (!UpdateAll(ctx.get(), EVP_DecryptUpdate, Bytes(associated_data), nullptr,
                 associated_data.size()) ||
      !UpdateAll(ctx.get(), EVP_DecryptUpdate, Bytes(sealed), Bytes(out), size) ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kAeadTagSize),
                          Bytes(tag)) != 1) {
    return Internal("OpenSSL: ChaCha20-Poly1305 opening failed");
  }
  if (EVP_DecryptFinal_ex(ctx.get(), Bytes(out) + size, &final_len) != 1) {
    OPENSSL_cleanse(out.data(), out.size());
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "ChaCha20-Poly1305: the message does not authenticate (altered ciphertext, nonce or "
        "associated data, or the wrong key)");
  }
  return out;
}

absl::StatusOr<std::string> AeadSealRandomNonce(absl::string_view key, absl::string_view plaintext,
                                                absl::string_view associated_data) {
  absl::StatusOr<std::string> nonce = RandomBytes(kAeadNonceSize);
  if (!nonce.ok()) return nonce.status();
  absl::StatusOr<std::string> sealed = AeadSeal(key, *nonce, plaintext, associated_data);
  if (!sealed.ok()) return sealed.status();
  return absl::StrCat(*nonce, *sealed);
}

absl::StatusOr<std::string> AeadOpenPrefixedNonce(absl::string_view key, absl::string_view message,
                                                  absl::string_view associated_data) {
  if (message.size() < kAeadNonceSize + kAeadTagSize) {
    return absl::InvalidArgumentError(absl::StrCat("ChaCha20-Poly1305: message of ", message.size(),
                                                   " bytes is shorter than its ", kAeadNonceSize,
                                                   "-byte nonce and ", kAeadTagSize, "-byte tag"));
  }
  return AeadOpen(key, message.substr(0, kAeadNonceSize), message.substr(kAeadNonceSize),
                  associated_data);
}

// --- Ed25519 ---------------------------------------------------------------------------------

absl::StatusOr<KeyPair> GenerateEd25519KeyPair() {
  return Generate(EVP_PKEY_ED25519, "Ed25519", kEd25519PrivateKeySize);
}

absl::StatusOr<KeyPair> Ed25519KeyPairFromPrivateKey(absl::string_view private_key) {
  return PairFromPrivate(EVP_PKEY_ED25519, "Ed25519", private_key);
}

absl::StatusOr<std::string> Ed25519Sign(absl::string_view private_key, absl::string_view message) {
  absl::StatusOr<Pkey> key = PrivateKey(EVP_PKEY_ED25519, "Ed25519", private_key);
  if (!key.ok()) return key.status();
  MdCtx ctx(EVP_MD_CTX_new());
  std::string signature(kEd25519SignatureSize, '\0');
  size_t len = signature.size();
  if (ctx == nullptr || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key->get()) != 1 ||
      EVP_DigestSign(ctx.get(), Bytes(signature), &len, Bytes(message), message.size()) != 1 ||
      len != kEd25519SignatureSize) {
    return Internal("OpenSSL: Ed25519 signing failed");
  }
  return signature;
}

absl::Status Ed25519Verify(absl::string_view public_key, absl::string_view message,
                           absl::string_view signature) {
  if (absl::Status s = CheckSize("Ed25519 signature", signature, kEd25519SignatureSize); !s.ok()) {
    return s;
  }
  absl::StatusOr<Pkey> key = PublicKey(EVP_PKEY_ED25519, "Ed25519", public_key);
  if (!key.ok()) return key.status();
  MdCtx ctx(EVP_MD_CTX_new());
  if (ctx == nullptr ||
      EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key->get()) != 1) {
    return Internal("OpenSSL: cannot start Ed25519 verification");
  }
  if (EVP_DigestVerify(ctx.get(), Bytes(signature), signature.size(), Bytes(message),
                       message.size()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("Ed25519: the signature does not verify under this key");
  }
  return absl::OkStatus();
}

}  // namespace shoal::privacy
