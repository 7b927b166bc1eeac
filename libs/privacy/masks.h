#pragma once

// The masks of secure aggregation (SecAgg, Bonawitz et al. 2017; SecAgg+, Bell et al. 2020):
// a peer adds to its fixed-point encoded update one self mask and, for each other peer in its
// neighbourhood, one pairwise mask, all in the ring Z_(2^k). A mask is a 32-byte seed expanded by
// the ChaCha20 keystream; the two ends of a pair derive the same seed (DeriveSharedSeed in
// crypto.h) and apply it with opposite signs, so the pairwise masks cancel exactly in the sum
// and only the self masks (removed with the seeds' Shamir shares) are left.
//
// Thread-safe: free functions without shared state.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy {

inline constexpr size_t kMaskSeedSize = 32;

// The mask of `count` elements of Z_(2^bits) (bits in 1..32) that `seed` (32 bytes) expands to:
// the ChaCha20 keystream under key = seed, a nonce of 12 zero bytes and block counter 0, read as
// little-endian uint32 values, each reduced mod 2^bits (2^bits divides 2^32, so they stay
// uniform). Deterministic: the same seed gives the same mask on every machine. The fixed nonce
// is safe because a seed expands into one mask only: derive a fresh seed per round and purpose
// (HKDF's context). Errors: INVALID_ARGUMENT on the seed size or bits.
absl::StatusOr<std::vector<uint32_t>> ExpandMask(absl::string_view seed, size_t count, int bits);

enum class MaskSign { kAdd, kSubtract };

// How `self_id` applies the mask it shares with `peer_id`: the peer whose id sorts lower
// (byte-wise) adds it, the higher one subtracts it, so the pair's two masks cancel in the sum.
// Errors: INVALID_ARGUMENT when the ids are equal (a peer shares no mask with itself).
absl::StatusOr<MaskSign> PairwiseMaskSign(absl::string_view self_id, absl::string_view peer_id);

// Any number of masks of Z_(2^bits) added to a vector in one pass: ApplyNext adds each mask's next
// elements, a block at a time, so the vector is read and written once whatever the count of
// masks (SecAgg+'s self mask and one pairwise mask per neighbour). The result is the same as
// ApplyMask with each seed in turn. Owned by one user; not thread-safe; movable.
class MaskStreams {
 public:
  // Errors: INVALID_ARGUMENT on bits out of 1..32.
  static absl::StatusOr<MaskStreams> Create(int bits);

  // One more mask, applied with `sign` from the next element on (ApplyNext's first call: element
  // 0). The seed's key schedule is kept, not the seed: the caller may scrub it at once. Errors: as
  // ExpandMask; INTERNAL if OpenSSL fails.
  absl::Status Add(absl::string_view seed, MaskSign sign);

  // values[i] = values[i] ± every mask's next element mod 2^bits, for the next values.size()
  // elements of the masks. Errors: INTERNAL if OpenSSL fails.
  absl::Status ApplyNext(absl::Span<uint32_t> values);

 private:
  struct Mask {
    ChaCha20Stream stream;
    MaskSign sign;
  };
  explicit MaskStreams(uint32_t ring) : ring_(ring) {}

  uint32_t ring_;
  std::vector<Mask> masks_;
};

// values[i] = values[i] ± ExpandMask(seed, values.size(), bits)[i] mod 2^bits, expanding the mask
// a block at a time (no buffer the size of the model). The result is reduced mod 2^bits.
// Errors: as ExpandMask; INTERNAL if OpenSSL fails.
absl::Status ApplyMask(absl::Span<uint32_t> values, absl::string_view seed, MaskSign sign,
                       int bits);

// sum[i] = sum[i] + values[i] mod 2^bits: folds one masked input into a running sum.
// Errors: INVALID_ARGUMENT on a length mismatch or bits out of 1..32.
absl::Status RingAdd(absl::Span<uint32_t> sum, absl::Span<const uint32_t> values, int bits);

}  // namespace shoal::privacy
