#pragma once

// t-of-n Shamir secret sharing of byte strings (seeds, private keys) for secure aggregation.
//
// The field is GF(p) with the Mersenne prime p = 2^61 - 1. The secret is cut into 7-byte chunks
// (each < 2^56 < p) and every chunk is shared with its own random polynomial of degree t - 1;
// share i holds the value of every polynomial at x = i. Why this field rather than one big prime
// with OpenSSL BIGNUM: the secrecy of Shamir's scheme is information-theoretic whatever the field
// size (any t - 1 shares are uniformly distributed, chunk by chunk, because the chunks' polynomials
// are independent), so the field need only hold a chunk and more x-coordinates than there are
// shares. With p < 2^61 a product fits in unsigned __int128 and reduces with two shifts, so the
// arithmetic is a few exact, allocation-free lines with no error paths, easy to audit; the
// coefficients still come from OpenSSL's CSPRNG (RAND_bytes). A 32-byte secret becomes 5 field
// elements (40 bytes) per share.
//
// Thread-safe: free functions without shared state.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shoal::privacy {

inline constexpr uint64_t kShamirPrime = (uint64_t{1} << 61) - 1;
inline constexpr size_t kShamirChunkBytes = 7;
inline constexpr int kMaxShamirShares = 65535;
inline constexpr size_t kMaxShamirSecretBytes = 1 << 16;

// One holder's share of a secret.
struct ShamirShare {
  uint32_t index = 0;        // the x-coordinate, 1..n (never 0: f(0) is the secret)
  uint32_t secret_size = 0;  // bytes in the shared secret
  // One field element (< kShamirPrime) per 7-byte chunk of the secret: ceil(secret_size / 7).
  std::vector<uint64_t> values;
};

// Splits `secret` (1 to kMaxShamirSecretBytes bytes) into `shares` shares with indices 1..shares,
// any `threshold` of which reconstruct it and fewer of which reveal nothing about it.
// 2 ≤ threshold ≤ shares ≤ kMaxShamirShares (a threshold of 1 would hand every holder the secret
// itself). Errors: INVALID_ARGUMENT naming the bad value; INTERNAL if the CSPRNG fails.
absl::StatusOr<std::vector<ShamirShare>> ShamirSplit(absl::string_view secret, int threshold,
                                                     int shares);

// Reconstructs the secret from at least `threshold` shares by Lagrange interpolation at 0.
// The first `threshold` shares determine it; every further share is checked to lie on the same
// polynomials, so a corrupted or forged extra share is caught rather than silently outvoted.
// Errors: INVALID_ARGUMENT on fewer shares than the threshold, a threshold < 2, an index of 0,
// an index given twice, shares of different secret sizes or value counts, a value outside the
// field, or an extra share that disagrees (named by index).
absl::StatusOr<std::string> ShamirCombine(absl::Span<const ShamirShare> shares, int threshold);

// A share as bytes, for sealing and sending: index (4 bytes), secret size (4 bytes), then each
// value (8 bytes), all little-endian.
std::string SerializeShamirShare(const ShamirShare& share);
// The inverse; checks the length, index and values. Errors: INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<ShamirShare> ParseShamirShare(absl::string_view bytes);

}  // namespace shoal::privacy
