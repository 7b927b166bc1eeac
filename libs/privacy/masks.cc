#include "libs/privacy/masks.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"

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

// Keystream bytes, read in place as host uint32 values, to the little-endian values they mean.
void FromLittleEndian(uint32_t* values, size_t count) {
#if !defined(ABSL_IS_LITTLE_ENDIAN)
  for (size_t i = 0; i < count; ++i) {
    const auto* b = reinterpret_cast<const uint8_t*>(values + i);
    values[i] = static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
  }
#else
  (void)values;
  (void)count;
#endif
}

}  // namespace

absl::StatusOr<MaskStreams> MaskStreams::Create(int bits) {
  absl::StatusOr<uint32_t> ring = RingMask(bits);
  if (!ring.ok()) return ring.status();
  return MaskStreams(*ring);
}

absl::Status MaskStreams::Add(absl::string_view seed, MaskSign sign) {
  if (seed.size() != kMaskSeedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask seed must be ", kMaskSeedSize, " bytes, got ", seed.size()));
  }
  absl::StatusOr<ChaCha20Stream> stream =
      ChaCha20Stream::Create(seed, std::string(kChaCha20NonceSize, '\0'), 0);
  if (!stream.ok()) return stream.status();
  masks_.push_back(Mask{*std::move(stream), sign});
  return absl::OkStatus();
}

absl::Status MaskStreams::ApplyNext(absl::Span<uint32_t> values) {
  // Sums mod 2^32 reduced mod 2^bits once at the end equal the sums reduced at every step, as
  // 2^bits divides 2^32.
  uint32_t mask[kBlockElements];
  for (size_t start = 0; start < values.size(); start += kBlockElements) {
    const size_t n = std::min(kBlockElements, values.size() - start);
    uint32_t* v = values.data() + start;
    for (Mask& m : masks_) {
      if (absl::Status s = m.stream.Next(absl::MakeSpan(reinterpret_cast<uint8_t*>(mask), 4 * n));
          !s.ok()) {
        return s;
      }
      FromLittleEndian(mask, n);
      if (m.sign == MaskSign::kAdd) {
        for (size_t i = 0; i < n; ++i) v[i] += mask[i];
      } else {
        for (size_t i = 0; i < n; ++i) v[i] -= mask[i];
      }
    }
    if (ring_ != 0xffffffffu) {
      for (size_t i = 0; i < n; ++i) v[i] &= ring_;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> ExpandMask(absl::string_view seed, size_t count, int bits) {
  absl::StatusOr<MaskStreams> streams = MaskStreams::Create(bits);
  if (!streams.ok()) return streams.status();
  if (absl::Status s = streams->Add(seed, MaskSign::kAdd); !s.ok()) return s;
  std::vector<uint32_t> mask(count);
  if (absl::Status s = streams->ApplyNext(absl::MakeSpan(mask)); !s.ok()) return s;
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
  absl::StatusOr<MaskStreams> streams = MaskStreams::Create(bits);
  if (!streams.ok()) return streams.status();
  if (absl::Status s = streams->Add(seed, sign); !s.ok()) return s;
  return streams->ApplyNext(values);
}

absl::Status RingAdd(absl::Span<uint32_t> sum, absl::Span<const uint32_t> values, int bits) {
  absl::StatusOr<uint32_t> ring = RingMask(bits);
  if (!ring.ok()) return ring.status();
  if (sum.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring sum: ", sum.size(), " elements, input has ", values.size()));
  }
  const uint32_t r = *ring;
  uint32_t* s = sum.data();
  const uint32_t* v = values.data();
  for (size_t i = 0; i < sum.size(); ++i) s[i] = (s[i] + v[i]) & r;
  return absl::OkStatus();
}

}  // namespace shoal::privacy
