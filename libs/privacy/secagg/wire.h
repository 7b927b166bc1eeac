#pragma once

// The byte-level conventions that the SecAgg client and server must agree on: how messages to
// sign, associated data and key-derivation contexts are framed, how the agreed keys and seeds are
// derived, and how ring values travel. Internal to libs/privacy/secagg.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/privacy/shamir.h"

namespace shoal::privacy::secagg {

// Each part as a 4-byte little-endian length then its bytes: no two lists of parts frame alike.
std::string Framed(std::initializer_list<absl::string_view> parts);

// The ChaCha20-Poly1305 key that seals the shares `sender` and `recipient` exchange in a round:
// both ends derive it, from their own encryption private key and the other's public key.
absl::StatusOr<std::string> ShareKey(absl::string_view round_id, absl::string_view private_key,
                                     absl::string_view peer_public_key);
// The associated data of the share `sender` seals for `recipient`.
std::string ShareAssociatedData(absl::string_view round_id, absl::string_view sender,
                                absl::string_view recipient);
// The seed of the pairwise mask of two participants: both ends derive it, from their own mask
// private key and the other's mask public key; so does the aggregator from a dropped
// participant's reconstructed private key.
absl::StatusOr<std::string> PairwiseMaskSeed(absl::string_view round_id,
                                             absl::string_view private_key,
                                             absl::string_view peer_public_key);

// Ring values as 4 little-endian bytes each.
std::string PackRingValues(absl::Span<const uint32_t> values);
// The same bytes written to out[0, 4 * values.size()).
void PackRingValuesTo(absl::Span<const uint32_t> values, char* out);
// The inverse. Errors: INVALID_ARGUMENT when `bytes` is not `count` values or a value exceeds
// `ring_mask` (naming the first).
absl::StatusOr<std::vector<uint32_t>> UnpackRingValues(absl::string_view bytes, size_t count,
                                                       uint32_t ring_mask);
// sum[i] = sum[i] + UnpackRingValues(bytes, sum.size(), ring_mask)[i] mod ring_mask + 1, without
// the unpacked copy; `ring_mask` is 2^k - 1. Errors: as UnpackRingValues, leaving `sum` as it was.
absl::Status AddPackedRingValues(absl::string_view bytes, uint32_t ring_mask,
                                 absl::Span<uint32_t> sum);
// Undoes AddPackedRingValues of the same `bytes` (which it took): sum[i] = sum[i] - value i mod
// ring_mask + 1, exactly, whatever was added in between.
void SubtractPackedRingValues(absl::string_view bytes, uint32_t ring_mask,
                              absl::Span<uint32_t> sum);

// OK when `key` is an X25519 public key's size; else INVALID_ARGUMENT naming `what`.
absl::Status CheckPublicKey(absl::string_view what, absl::string_view key);

// Clears a secret's bytes (OPENSSL_cleanse) and empties it.
void Scrub(std::string& secret);
// The same for Shamir shares' values.
void Scrub(std::vector<ShamirShare>& shares);

}  // namespace shoal::privacy::secagg
