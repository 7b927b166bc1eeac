#include "libs/privacy/masks.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy {
namespace {

// Elements expanded per keystream call: 16 KiB, small enough for the L1/L2 cache.
constexpr size_t kBlockElements = 4096;

absl::StatusOr<uint32_t> RingMask(int bits) {
  if (bits < 1 || bits > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask ring: bits must be in [1, 32], got ", bits));
  }
  return bits == 32 ? 0xffffffffu : (uint32_t{1} << bits) - 1;
}

absl::StatusOr<ChaCha20Stream> MaskStream(absl::string_view seed) {
  if (seed.size() != kMaskSeedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask seed must be ", kMaskSeedSize, " bytes, got ", seed.size()));
  }
  return ChaCha20Stream::Create(seed, std::string(kChaCha20NonceSize, '\0'), 0);
}

// Streams the mask of `values.size()` elements into `apply(index, mask_element)`.
template <typename Apply>
absl::Status ForEachMaskElement(absl::string_view seed, size_t count, Apply apply) {
  absl::StatusOr<ChaCha20Stream> stream = MaskStream(seed);
  if (!stream.ok()) return stream.status();
  uint8_t block[4 * kBlockElements];
  for (size_t start = 0; start < count; start += kBlockElements) {
    const size_t n = std::min(kBlockElements, count - start);
    if (absl::Status s = stream->Next(absl::MakeSpan(block, 4 * n)); !s.ok()) return s;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* b = block + 4 * i;
      apply(start + i, static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                           static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> ExpandMask(absl::string_view seed, size_t count, int bits) {
  absl::StatusOr<uint32_t> ring = RingMask(bits);
  if (!ring.ok()) return ring.status();
  std::vector<uint32_t> mask(count);
  absl::Status s =
      ForEachMaskElement(seed, count, [&](size_t i, uint32_t m) { mask[i] = m & *ring; });
  if (!s.ok()) return s;
  return mask;
}

absl::StatusOr<MaskSign> PairwiseMaskSign(absl::string_view self_id, absl::string_view peer_id) {
  if (self_id == peer_id) {
    return absl::InvalidArgumentError(
        "pairwise mask: both ids are the same; a peer shares no mask with itself");
  }
  return self_id < peer_id ? MaskSign::kAdd : MaskSign::kSubtract;
}

absl::Status ApplyMask(absl::Span<uint32_t> values, absl::string_view seed, MaskSign sign,
                       int bits) {
  absl::StatusOr<uint32_t> ring = RingMask(bits);
  if (!ring.ok()) return ring.status();
  const uint32_t r = *ring;
  if (sign == MaskSign::kAdd) {
    return ForEachMaskElement(seed, values.size(),
                              [&](size_t i, uint32_t m) { values[i] = (values[i] + m) & r; });
  }
  return ForEachMaskElement(seed, values.size(),
                            [&](size_t i, uint32_t m) { values[i] = (values[i] - m) & r; });
}

absl::Status RingAdd(absl::Span<uint32_t> sum, absl::Span<const uint32_t> values, int bits) {
  absl::StatusOr<uint32_t> ring = RingMask(bits);
  if (!ring.ok()) return ring.status();
  if (sum.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring sum: ", sum.size(), " elements, input has ", values.size()));
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = (sum[i] + values[i]) & *ring;
  return absl::OkStatus();
}

}  // namespace shoal::privacy
