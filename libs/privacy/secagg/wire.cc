#include "libs/privacy/secagg/wire.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy::secagg {
namespace {

void AppendLittleEndian(uint32_t value, std::string& out) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::string Framed(std::initializer_list<absl::string_view> parts) {
  std::string out;
  for (absl::string_view part : parts) {
    AppendLittleEndian(static_cast<uint32_t>(part.size()), out);
    out.append(part.data(), part.size());
  }
  return out;
}

absl::StatusOr<std::string> ShareKey(absl::string_view round_id, absl::string_view private_key,
                                     absl::string_view peer_public_key) {
  return DeriveSharedSeed(private_key, peer_public_key,
                          Framed({"shoal.secagg.v1 share key", round_id}));
}

std::string ShareAssociatedData(absl::string_view round_id, absl::string_view sender,
                                absl::string_view recipient) {
  return Framed({"shoal.secagg.v1 share", round_id, sender, recipient});
}

absl::StatusOr<std::string> PairwiseMaskSeed(absl::string_view round_id,
                                             absl::string_view private_key,
                                             absl::string_view peer_public_key) {
  return DeriveSharedSeed(private_key, peer_public_key,
                          Framed({"shoal.secagg.v1 pairwise mask", round_id}));
}

std::string PackRingValues(absl::Span<const uint32_t> values) {
  std::string out;
  out.reserve(4 * values.size());
  for (uint32_t v : values) AppendLittleEndian(v, out);
  return out;
}

absl::StatusOr<std::vector<uint32_t>> UnpackRingValues(absl::string_view bytes, size_t count,
                                                       uint32_t ring_mask) {
  if (bytes.size() != 4 * count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "masked input: ", bytes.size(), " bytes, expected ", 4 * count, " (", count, " values)"));
  }
  std::vector<uint32_t> values(count);
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < count; ++i, b += 4) {
    values[i] = static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
    if (values[i] > ring_mask) {
      return absl::InvalidArgumentError(absl::StrCat("masked input: value ", i, " (", values[i],
                                                     ") is outside the ring (at most ", ring_mask,
                                                     ")"));
    }
  }
  return values;
}

absl::Status CheckPublicKey(absl::string_view what, absl::string_view key) {
  if (key.size() != kX25519KeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", key.size(), " bytes, an X25519 key has ", kX25519KeySize));
  }
  return absl::OkStatus();
}

void Scrub(std::string& secret) {
  if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
  secret.clear();
}

void Scrub(std::vector<ShamirShare>& shares) {
  for (ShamirShare& share : shares) {
    if (!share.values.empty()) {
      OPENSSL_cleanse(share.values.data(), share.values.size() * sizeof(share.values[0]));
    }
  }
  shares.clear();
}

}  // namespace shoal::privacy::secagg
