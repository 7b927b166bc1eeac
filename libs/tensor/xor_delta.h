#pragma once

// Model downloads against a version the receiver already holds (tensor.proto
// ENCODING_XOR_ZLIB): each tensor travels as the bitwise XOR of its float32 bits with the held
// version's, each block of kXorBlockValues values byte plane by byte plane, deflated with zlib.
// Successive versions share the sign, the exponent and the high mantissa bits of most values,
// so the high byte planes of the XOR are mostly zeros and deflate well. A tensor whose
// deflated XOR would not be smaller than its raw bytes travels raw.

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

// Values per block of an XOR_ZLIB tensor (tensor.proto): each block's XOR is sent byte plane by
// byte plane.
inline constexpr size_t kXorBlockValues = 8192;

// `model` with each tensor XOR_ZLIB-encoded against `base` (the same layout), or raw where that
// is not smaller. `digests` holds each tensor's XXH3 of its float32 bytes, so the receiver
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

// Rebuilds one XOR_ZLIB tensor as its compressed bytes arrive: inflates them, XORs the result
// with the held base's values (read through `base` at the tensor's element offset) and hands
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
  absl::Status Drain(const Emit& emit);  // rebuilds and emits the block in out_
  static absl::Status Corrupt(const z_stream_s& z);

  std::unique_ptr<z_stream_s> stream_;
  bool started_ = false;  // stream_ holds an inflate state
  bool ended_ = false;    // the zlib stream ended
  ReadValues base_;
  size_t offset_ = 0;           // the tensor's first element
  uint64_t bytes_total_ = 0;    // the tensor's float32 bytes
  uint64_t bytes_emitted_ = 0;  // of them, emitted
  std::vector<float> out_;      // the block's inflated byte planes
  std::vector<float> held_;     // the block's base values, then its rebuilt values
  size_t out_bytes_ = 0;        // inflated bytes in out_
};

}  // namespace shoal::tensor
