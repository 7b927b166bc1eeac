#include "libs/privacy/secagg/wire.h"

#include <openssl/crypto.h>

#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy::secagg {
namespace {

void AppendLittleEndian(uint32_t value, std::string& out) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Value i of packed ring values.
uint32_t RingValueAt(absl::string_view bytes, size_t i) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * i;
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
         static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
}

// UnpackRingValues' errors.
absl::Status CheckRingValues(absl::string_view bytes, size_t count, uint32_t ring_mask) {
  if (bytes.size() != 4 * count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "masked input: ", bytes.size(), " bytes, expected ", 4 * count, " (", count, " values)"));
  }
  if (ring_mask == 0xffffffffu) return absl::OkStatus();  // every value is in the ring
  for (size_t i = 0; i < count; ++i) {
    const uint32_t value = RingValueAt(bytes, i);
    if (value > ring_mask) {
      return absl::InvalidArgumentError(absl::StrCat("masked input: value ", i, " (", value,
                                                     ") is outside the ring (at most ", ring_mask,
                                                     ")"));
    }
  }
  return absl::OkStatus();
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
  std::string out(4 * values.size(), '\0');
  PackRingValuesTo(values, out.data());
  return out;
}

void PackRingValuesTo(absl::Span<const uint32_t> values, char* out) {
#if defined(ABSL_IS_LITTLE_ENDIAN)
  if (!values.empty()) std::memcpy(out, values.data(), 4 * values.size());
#else
  for (uint32_t v : values) {
    for (int i = 0; i < 4; ++i) *out++ = static_cast<char>((v >> (8 * i)) & 0xff);
  }
#endif
}

absl::StatusOr<std::vector<uint32_t>> UnpackRingValues(absl::string_view bytes, size_t count,
                                                       uint32_t ring_mask) {
  if (absl::Status s = CheckRingValues(bytes, count, ring_mask); !s.ok()) return s;
  std::vector<uint32_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = RingValueAt(bytes, i);
  return values;
}

absl::Status AddPackedRingValues(absl::string_view bytes, uint32_t ring_mask,
                                 absl::Span<uint32_t> sum) {
  if (absl::Status s = CheckRingValues(bytes, sum.size(), ring_mask); !s.ok()) return s;
  uint32_t* out = sum.data();
  for (size_t i = 0; i < sum.size(); ++i) out[i] = (out[i] + RingValueAt(bytes, i)) & ring_mask;
  return absl::OkStatus();
}

void SubtractPackedRingValues(absl::string_view bytes, uint32_t ring_mask,
                              absl::Span<uint32_t> sum) {
  uint32_t* out = sum.data();
  for (size_t i = 0; i < sum.size(); ++i) out[i] = (out[i] - RingValueAt(bytes, i)) & ring_mask;
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
