#pragma once

// Model downloads against a version the receiver already holds (tensor.proto
// ENCODING_XOR_SPARSE_ZLIB): each tensor travels as the bitwise XOR of its float32 bits with the
// held version's, deflated with zlib; each block of kXorBlockValues values as a bitmap of the
// values that changed, then the changed values' XOR byte plane by byte plane. A round whose
// updates were sparse (top-k) changes few values, and the bitmap names them once; successive
// versions share the sign, the exponent and the high mantissa bits of most values, so the high
// byte planes are mostly zeros and deflate well. A tensor whose deflated XOR would not be
// smaller than its raw bytes travels raw.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"

// zlib's stream state, kept out of this header.
struct z_stream_s;

namespace shoal::tensor {

// Values per block of an XOR_SPARSE_ZLIB tensor (tensor.proto).
inline constexpr size_t kXorBlockValues = 8192;

// The most bytes one block of `n` values takes before deflate: its bitmap and every value.
constexpr size_t XorBlockBound(size_t n) { return (n + 7) / 8 + 4 * n; }

// Writes one block of XORed values `x` (at most kXorBlockValues) as tensor.proto lays it out
// before deflate, into `out` (room for XorBlockBound(x.size()) bytes): the bitmap (bit i % 8 of
// byte i / 8 set when x[i] is not 0; the bits past the last value 0), then the low byte of each
// non-zero x[i], in order, the second byte of each, the third, the high one. Returns the bytes
// written.
size_t WriteXorBlock(absl::Span<const uint32_t> x, uint8_t* out);

// `model` with each tensor XOR_SPARSE_ZLIB-encoded against `base` (the same layout), or raw where
// that is not smaller. `digests` holds each tensor's XXH3 of its float32 bytes, so the receiver
// verifies the model it rebuilt, not just the bytes it received. Keeps `model` alive (a raw
// tensor's payload is a view of it). INVALID_ARGUMENT when the layouts differ. `keep_going`
// (optional) is asked before each block of kXorBlockValues values: once it says no the encoding
// stops, CANCELLED. A tensor's zlib stream is made of segments of 2 MiB of values deflated on
// their own, on up to `threads` threads (the calling one and others started for the call), and
// `keep_going` is then asked from several threads at once. The result is the same bytes whichever
// thread made each segment.
absl::StatusOr<std::shared_ptr<const EncodedModel>> EncodeXorDelta(
    std::shared_ptr<const FlatModel> model, const FlatModel& base,
    const std::function<bool()>& keep_going = nullptr, int threads = 1);

// Rebuilds one XOR_SPARSE_ZLIB tensor as its compressed bytes arrive: inflates them, XORs the
// result with the held base's values (read through `base` at the tensor's element offset) and hands
// the rebuilt float32 bytes on in whole values. Bounded memory (one 32 KiB block), whatever the
// tensor's size. Not thread-safe; movable.
class XorInflater {
 public:
  // The rebuilt bytes, a whole number of float32 values at a time.
  using Emit = std::function<absl::Status(absl::string_view bytes)>;

  XorInflater();
  ~XorInflater();
  XorInflater(XorInflater&&) noexcept;
  XorInflater& operator=(XorInflater&&) noexcept;

  // Starts a tensor of `elements` values whose base values are `base` from element `offset`.
  absl::Status Start(ReadValues base, size_t offset, uint64_t elements);
  // Inflates `compressed` (the next bytes of the tensor's payload) and emits what it yields.
  // INVALID_ARGUMENT when the data is not a zlib stream, inflates to more than the tensor, or
  // goes on past the stream's end.
  absl::Status Feed(absl::string_view compressed, const Emit& emit);
  // After the last byte: INVALID_ARGUMENT unless the zlib stream ended and yielded exactly the
  // tensor's bytes.
  absl::Status Finish() const;

 private:
  // With a block's bitmap in out_, counts the values it names; INVALID_ARGUMENT when it names
  // any past the block's `n`.
  absl::Status CountChanged(size_t n);
  absl::Status Drain(size_t n, const Emit& emit);  // rebuilds and emits the block in out_
  static absl::Status Corrupt(const z_stream_s& z);

  std::unique_ptr<z_stream_s> stream_;
  bool started_ = false;  // stream_ holds an inflate state
  bool ended_ = false;    // the zlib stream ended
  ReadValues base_;
  size_t offset_ = 0;           // the tensor's first element
  uint64_t bytes_total_ = 0;    // the tensor's float32 bytes
  uint64_t bytes_emitted_ = 0;  // of them, emitted
  std::vector<uint8_t> out_;    // the block's inflated bitmap and byte planes
  std::vector<float> held_;     // the block's base values, then its rebuilt values
  size_t out_bytes_ = 0;        // inflated bytes in out_
  int changed_ = -1;            // the values the block's bitmap names; -1 until it is in
};

}  // namespace shoal::tensor
