#include "libs/discovery/announcement.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal::discovery {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;

Bio MemBio(absl::string_view pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The subject's common name, "" when there is none.
std::string CommonName(X509* cert) {
  X509_NAME* name = X509_get_subject_name(cert);
  int index = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (index < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) return "";
  std::string cn(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return cn;
}

// SHA-256 for EC and RSA keys; none for Ed25519 and Ed448, which hash internally.
const EVP_MD* DigestFor(EVP_PKEY* key) {
  const int id = EVP_PKEY_get_id(key);
  return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

}  // namespace

absl::StatusOr<AnnouncementSigner> AnnouncementSigner::Create(absl::string_view cert_pem,
                                                              absl::string_view key_pem) {
  Bio cert_bio = MemBio(cert_pem);
  Cert cert(cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) return absl::InvalidArgumentError("certificate: not a PEM X.509 certificate");
  Bio key_bio = MemBio(key_pem);
  EVP_PKEY* key =
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr;
  if (key == nullptr) return absl::InvalidArgumentError("key: not a PEM private key");
  AnnouncementSigner signer;
  signer.key_ = std::shared_ptr<EVP_PKEY>(key, EVP_PKEY_free);
  if (X509_check_private_key(cert.get(), key) != 1) {
    return absl::InvalidArgumentError("key: does not belong to the certificate");
  }
  signer.peer_id_ = CommonName(cert.get());
  if (signer.peer_id_.empty()) {
    return absl::InvalidArgumentError("certificate: no subject common name (the peer id)");
  }
  unsigned char* der = nullptr;
  int n = i2d_X509(cert.get(), &der);
  if (n <= 0) return absl::InternalError("certificate: cannot encode it as DER");
  signer.certificate_der_.assign(reinterpret_cast<char*>(der), static_cast<size_t>(n));
  OPENSSL_free(der);
  return signer;
}

absl::StatusOr<std::string> AnnouncementSigner::Sign(
    const peer::v1::PeerAnnouncement& announcement) const {
  if (announcement.peer_id() != peer_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("announcement: peer id \"", announcement.peer_id(),
                     "\" is not the certificate's \"", peer_id_, "\""));
  }
  peer::v1::SignedAnnouncement out;
  announcement.SerializeToString(out.mutable_announcement());
  const std::string& message = out.announcement();
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  size_t size = 0;
  if (!ctx ||
      EVP_DigestSignInit(ctx.get(), nullptr, DigestFor(key_.get()), nullptr, key_.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &size,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return absl::InternalError("announcement: OpenSSL cannot sign");
  }
  std::string signature(size, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return absl::InternalError("announcement: OpenSSL cannot sign");
  }
  signature.resize(size);
  out.set_certificate(certificate_der_);
  out.set_signature(std::move(signature));
  return out.SerializeAsString();
}

absl::StatusOr<AnnouncementVerifier> AnnouncementVerifier::Create(absl::string_view ca_pem) {
  AnnouncementVerifier verifier;
  verifier.store_ = std::shared_ptr<X509_STORE>(X509_STORE_new(), X509_STORE_free);
  Bio bio = MemBio(ca_pem);
  int count = 0;
  while (bio && verifier.store_) {
    Cert ca(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!ca) break;
    if (X509_STORE_add_cert(verifier.store_.get(), ca.get()) == 1) ++count;
  }
  if (count == 0) return absl::InvalidArgumentError("CA: no PEM X.509 certificate");
  return verifier;
}

absl::StatusOr<peer::v1::PeerAnnouncement> AnnouncementVerifier::Verify(
    absl::string_view signed_announcement, absl::string_view task) const {
  if (signed_announcement.size() > kMaxSignedAnnouncementBytes) {
    return absl::InvalidArgumentError(absl::StrCat("announcement: ", signed_announcement.size(),
                                                   " bytes, more than the limit of ",
                                                   kMaxSignedAnnouncementBytes));
  }
  peer::v1::SignedAnnouncement in;
  if (!in.ParseFromArray(signed_announcement.data(),
                         static_cast<int>(signed_announcement.size()))) {
    return absl::InvalidArgumentError("announcement: not a SignedAnnouncement");
  }
  if (in.signature().empty()) return absl::InvalidArgumentError("announcement: not signed");
  const auto* der = reinterpret_cast<const unsigned char*>(in.certificate().data());
  Cert cert(d2i_X509(nullptr, &der, static_cast<long>(in.certificate().size())));
  if (!cert) return absl::InvalidArgumentError("announcement: no DER X.509 certificate");
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> store_ctx(X509_STORE_CTX_new());
  if (!store_ctx || X509_STORE_CTX_init(store_ctx.get(), store_.get(), cert.get(), nullptr) != 1) {
    return absl::InternalError("announcement: OpenSSL cannot verify");
  }
  if (X509_verify_cert(store_ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "announcement: certificate not trusted (",
        X509_verify_cert_error_string(X509_STORE_CTX_get_error(store_ctx.get())), ")"));
  }
  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (key == nullptr || !ctx ||
      EVP_DigestVerifyInit(ctx.get(), nullptr, DigestFor(key), nullptr, key) != 1) {
    return absl::InvalidArgumentError("announcement: the certificate's key cannot verify");
  }
  if (EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(in.signature().data()),
                       in.signature().size(),
                       reinterpret_cast<const unsigned char*>(in.announcement().data()),
                       in.announcement().size()) != 1) {
    return absl::InvalidArgumentError("announcement: the signature does not verify");
  }
  peer::v1::PeerAnnouncement announcement;
  if (!announcement.ParseFromString(in.announcement())) {
    return absl::InvalidArgumentError("announcement: not a PeerAnnouncement");
  }
  const std::string cn = CommonName(cert.get());
  if (announcement.peer_id().empty() || announcement.peer_id() != cn) {
    return absl::InvalidArgumentError(absl::StrCat("announcement: peer id ",
                                                   QuoteBytes(announcement.peer_id()),
                                                   " is not the certificate's ", QuoteBytes(cn)));
  }
  if (announcement.task() != task) {
    return absl::InvalidArgumentError(absl::StrCat(
        "announcement: for task ", QuoteBytes(announcement.task()), ", not ", QuoteBytes(task)));
  }
  if (announcement.address().empty()) {
    return absl::InvalidArgumentError("announcement: no address");
  }
  return announcement;
}

}  // namespace shoal::discovery
