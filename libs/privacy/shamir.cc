#include "libs/privacy/shamir.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace shoal::privacy {
namespace {

constexpr uint64_t kP = kShamirPrime;

size_t ChunkCount(size_t secret_size) {
  return (secret_size + kShamirChunkBytes - 1) / kShamirChunkBytes;
}

// x mod p for x < 2^64.
uint64_t Reduce(uint64_t x) {
  x = (x & kP) + (x >> 61);
  return x >= kP ? x - kP : x;
}

uint64_t AddMod(uint64_t a, uint64_t b) { return Reduce(a + b); }
uint64_t SubMod(uint64_t a, uint64_t b) { return Reduce(a + kP - b); }

uint64_t MulMod(uint64_t a, uint64_t b) {
  const unsigned __int128 z = static_cast<unsigned __int128>(a) * b;  // < 2^122
  // 2^61 ≡ 1 (mod p): fold the high bits onto the low ones.
  return Reduce(static_cast<uint64_t>(z & kP) + static_cast<uint64_t>(z >> 61));
}

uint64_t PowMod(uint64_t base, uint64_t exponent) {
  uint64_t result = 1;
  while (exponent != 0) {
    if (exponent & 1) result = MulMod(result, base);
    base = MulMod(base, base);
    exponent >>= 1;
  }
  return result;
}

// a^-1 for a ≠ 0, by Fermat: a^(p-2).
uint64_t InvMod(uint64_t a) { return PowMod(a, kP - 2); }

// Lagrange basis at `x` for the nodes `xs`: l_j(x) = prod_{m≠j} (x - x_m) / (x_j - x_m).
std::vector<uint64_t> LagrangeBasis(const std::vector<uint64_t>& xs, uint64_t x) {
  std::vector<uint64_t> basis(xs.size());
  for (size_t j = 0; j < xs.size(); ++j) {
    uint64_t num = 1;
    uint64_t den = 1;
    for (size_t m = 0; m < xs.size(); ++m) {
      if (m == j) continue;
      num = MulMod(num, SubMod(x, xs[m]));
      den = MulMod(den, SubMod(xs[j], xs[m]));
    }
    basis[j] = MulMod(num, InvMod(den));
  }
  return basis;
}

uint64_t LoadLe(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void StoreLe(uint64_t v, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Uniform elements of GF(p) from the CSPRNG: 61 random bits, redrawn in the 2^-61 case of p.
absl::Status RandomFieldElements(std::vector<uint64_t>& out) {
  std::vector<unsigned char> bytes(8 * out.size());
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return absl::InternalError("OpenSSL RAND_bytes failed");
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t v = LoadLe(bytes.data() + 8 * i, 8) & kP;
    while (v == kP) {
      unsigned char more[8];
      if (RAND_bytes(more, sizeof(more)) != 1) {
        return absl::InternalError("OpenSSL RAND_bytes failed");
      }
      v = LoadLe(more, 8) & kP;
    }
    out[i] = v;
  }
  OPENSSL_cleanse(bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::Status CheckThreshold(int threshold) {
  if (threshold < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Shamir threshold must be at least 2 (1 would give every holder the secret), got ",
        threshold));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ShamirShare>> ShamirSplit(absl::string_view secret, int threshold,
                                                     int shares) {
  if (secret.empty() || secret.size() > kMaxShamirSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Shamir secret must be 1 to ", kMaxShamirSecretBytes, " bytes, got ", secret.size()));
  }
  if (absl::Status s = CheckThreshold(threshold); !s.ok()) return s;
  if (shares < threshold || shares > kMaxShamirShares) {
    return absl::InvalidArgumentError(absl::StrCat("Shamir share count must be in [threshold ",
                                                   threshold, ", ", kMaxShamirShares, "], got ",
                                                   shares));
  }
  const size_t chunks = ChunkCount(secret.size());
  // coefficients[c * (t-1) + d]: the x^(d+1) coefficient of chunk c's polynomial.
  const size_t degree = static_cast<size_t>(threshold) - 1;
  std::vector<uint64_t> coefficients(chunks * degree);
  if (absl::Status s = RandomFieldElements(coefficients); !s.ok()) return s;

  std::vector<ShamirShare> out(static_cast<size_t>(shares));
  for (size_t k = 0; k < out.size(); ++k) {
    out[k].index = static_cast<uint32_t>(k + 1);
    out[k].secret_size = static_cast<uint32_t>(secret.size());
    out[k].values.resize(chunks);
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(secret.data());
  for (size_t c = 0; c < chunks; ++c) {
    const size_t offset = c * kShamirChunkBytes;
    const uint64_t constant =
        LoadLe(bytes + offset, std::min(kShamirChunkBytes, secret.size() - offset));
    const uint64_t* coeff = coefficients.data() + c * degree;
    for (ShamirShare& share : out) {
      // Horner: f(x) = constant + x (a1 + x (a2 + ... )).
      uint64_t y = 0;
      for (size_t d = degree; d > 0; --d) y = AddMod(MulMod(y, share.index), coeff[d - 1]);
      share.values[c] = AddMod(MulMod(y, share.index), constant);
    }
  }
  OPENSSL_cleanse(coefficients.data(), coefficients.size() * sizeof(uint64_t));
  return out;
}

absl::StatusOr<std::string> ShamirCombine(absl::Span<const ShamirShare> shares, int threshold) {
  if (absl::Status s = CheckThreshold(threshold); !s.ok()) return s;
  if (shares.size() < static_cast<size_t>(threshold)) {
    return absl::InvalidArgumentError(absl::StrCat("Shamir: ", shares.size(),
                                                   " shares cannot reconstruct a secret of "
                                                   "threshold ",
                                                   threshold));
  }
  const uint32_t secret_size = shares[0].secret_size;
  if (secret_size == 0 || secret_size > kMaxShamirSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shamir share: secret size ", secret_size, " is out of range"));
  }
  const size_t chunks = ChunkCount(secret_size);
  absl::flat_hash_set<uint32_t> seen;
  for (const ShamirShare& share : shares) {
    if (share.index == 0) {
      return absl::InvalidArgumentError("Shamir share with index 0 (the secret's own point)");
    }
    if (!seen.insert(share.index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Shamir share index ", share.index, " is given twice"));
    }
    if (share.secret_size != secret_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Shamir share ", share.index, " is for a ", share.secret_size, "-byte secret, share ",
          shares[0].index, " for a ", secret_size, "-byte one"));
    }
    if (share.values.size() != chunks) {
      return absl::InvalidArgumentError(absl::StrCat("Shamir share ", share.index, " has ",
                                                     share.values.size(), " values, a ",
                                                     secret_size, "-byte secret needs ", chunks));
    }
    for (uint64_t v : share.values) {
      if (v >= kP) {
        return absl::InvalidArgumentError(
            absl::StrCat("Shamir share ", share.index, " holds a value outside the field"));
      }
    }
  }
  std::vector<uint64_t> xs;
  xs.reserve(static_cast<size_t>(threshold));
  for (int j = 0; j < threshold; ++j) xs.push_back(shares[static_cast<size_t>(j)].index);
  const std::vector<uint64_t> at_zero = LagrangeBasis(xs, 0);
  auto interpolate = [&](const std::vector<uint64_t>& basis, size_t chunk) {
    uint64_t y = 0;
    for (size_t j = 0; j < basis.size(); ++j) {
      y = AddMod(y, MulMod(basis[j], shares[j].values[chunk]));
    }
    return y;
  };
  for (size_t k = static_cast<size_t>(threshold); k < shares.size(); ++k) {
    const std::vector<uint64_t> basis = LagrangeBasis(xs, shares[k].index);
    for (size_t c = 0; c < chunks; ++c) {
      if (interpolate(basis, c) != shares[k].values[c]) {
        return absl::InvalidArgumentError(
            absl::StrCat("Shamir share ", shares[k].index, " does not agree with the first ",
                         threshold, " shares (corrupted, forged, or from another secret)"));
      }
    }
  }
  std::string secret(secret_size, '\0');
  for (size_t c = 0; c < chunks; ++c) {
    const uint64_t y = interpolate(at_zero, c);
    const size_t offset = c * kShamirChunkBytes;
    const size_t n = std::min(kShamirChunkBytes, secret.size() - offset);
    if ((y >> (8 * n)) != 0) {
      // A chunk's constant term is below 2^(8n); anything else means the shares do not belong
      // to one sharing (too few of the real ones, or altered ones).
      return absl::InvalidArgumentError(
          "Shamir shares do not interpolate to a valid secret (shares from different "
          "sharings, or altered)");
    }
    StoreLe(y, n, secret.data() + offset);
  }
  return secret;
}

std::string SerializeShamirShare(const ShamirShare& share) {
  std::string out(8 + 8 * share.values.size(), '\0');
  StoreLe(share.index, 4, out.data());
  StoreLe(share.secret_size, 4, out.data() + 4);
  for (size_t i = 0; i < share.values.size(); ++i) {
    StoreLe(share.values[i], 8, out.data() + 8 + 8 * i);
  }
  return out;
}

absl::StatusOr<ShamirShare> ParseShamirShare(absl::string_view bytes) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shamir share: ", bytes.size(), " bytes, shorter than its 8-byte header"));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  ShamirShare share;
  share.index = static_cast<uint32_t>(LoadLe(p, 4));
  share.secret_size = static_cast<uint32_t>(LoadLe(p + 4, 4));
  if (share.index == 0) return absl::InvalidArgumentError("Shamir share: index 0");
  if (share.secret_size == 0 || share.secret_size > kMaxShamirSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shamir share: secret size ", share.secret_size, " is out of range"));
  }
  const size_t chunks = ChunkCount(share.secret_size);
  if (bytes.size() != 8 + 8 * chunks) {
    return absl::InvalidArgumentError(absl::StrCat("Shamir share: ", bytes.size(),
                                                   " bytes, a share of a ", share.secret_size,
                                                   "-byte secret has ", 8 + 8 * chunks));
  }
  share.values.resize(chunks);
  for (size_t i = 0; i < chunks; ++i) {
    share.values[i] = LoadLe(p + 8 + 8 * i, 8);
    if (share.values[i] >= kP) {
      return absl::InvalidArgumentError(
          absl::StrCat("Shamir share: value ", i, " is outside the field"));
    }
  }
  return share;
}

}  // namespace shoal::privacy
