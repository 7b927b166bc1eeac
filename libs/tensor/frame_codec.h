#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/xor_delta.h"
#include "shoal/common/v1/model.pb.h"
#include "shoal/common/v1/tensor.pb.h"

namespace shoal::tensor {

inline constexpr size_t kDefaultChunkBytes = 1 << 20;
// Largest chunk a decoder accepts; senders use kDefaultChunkBytes.
inline constexpr size_t kMaxChunkBytes = 4 << 20;

// A model received from a stream: the ModelMeta it started with and the model itself.
struct ReceivedModel {
  common::v1::ModelMeta meta;
  FlatModel model;
  uint64_t payload_bytes = 0;  // chunk bytes received (FrameDecoder::bytes_received)
};

// The ModelMeta that starts a stream of `model` (of a model with `layout`).
common::v1::ModelMeta MakeModelMeta(const std::string& task, uint64_t version,
                                    const FlatModel& model);
common::v1::ModelMeta MakeModelMeta(const std::string& task, uint64_t version,
                                    const ModelLayout& layout);

// Fills `header` for a float32 tensor `spec` whose raw payload is `size_bytes` with XXH3 `digest`.
void SetTensorHeader(const TensorSpec& spec, uint64_t size_bytes, uint64_t digest,
                     common::v1::TensorHeader* header);

// Turns a model into TensorFrames: for each tensor a header (with its XXH3 digest) and then its
// bytes in chunks of at most `chunk_bytes`. Reads `model` in place; the model must outlive the
// encoder and not change while it is used. Not thread-safe.
class FrameEncoder {
 public:
  explicit FrameEncoder(const FlatModel& model, size_t chunk_bytes = kDefaultChunkBytes);
  // An encoded (e.g. compressed) update: each header carries its tensor's encoding.
  explicit FrameEncoder(const EncodedModel& model, size_t chunk_bytes = kDefaultChunkBytes);
  // Fills `frame` with the next frame; returns false when the model has been fully sent.
  // Reuses the frame's string capacity, so passing the same frame every time saves allocations.
  bool Next(common::v1::TensorFrame* frame);

 private:
  const ModelLayout& layout_;
  std::vector<absl::string_view> payloads_;  // each tensor's bytes
  std::vector<TensorEncoding> encodings_;    // each tensor's; empty: all raw
  std::vector<uint64_t> digests_;            // each tensor's header digest; empty: the payload's
  size_t chunk_bytes_;
  size_t tensor_ = 0;       // index of the current tensor
  size_t byte_offset_ = 0;  // bytes of the current tensor already sent
  bool header_sent_ = false;
};

struct DecoderLimits {
  uint32_t max_tensors = 4096;
  uint64_t max_total_bytes = uint64_t{4} << 30;  // 4 GiB
};

// Rebuilds a model from TensorFrames, checking everything: frame order, dtype, encoding, shapes,
// sizes, chunk sizes, digests, and optionally that every float32 value is finite. ForLayout
// decoders (updates) also take compressed tensors (FP16, INT8, SPARSE; see compression.h), decoded
// to float32 and checked the same way, and DTYPE_UINT32 tensors (raw) where the layout has
// Element::kUint32 ones; ForMeta decoders (models) take raw float32 tensors only. Errors are
// INVALID_ARGUMENT naming the tensor and what is wrong; after an error every later call returns
// the same error. Movable, not thread-safe.
class FrameDecoder {
 public:
  // Expects exactly `layout` (names, shapes, elements, order), e.g. for a delta against a known
  // model.
  static FrameDecoder ForLayout(const ModelLayout& layout, bool require_finite);
  // Same, decoding into `buffer` (its contents are overwritten; its capacity is reused, which
  // saves the first-touch cost of a fresh allocation — pass buffers from a pool).
  static FrameDecoder ForLayout(const ModelLayout& layout, bool require_finite,
                                std::vector<float> buffer);
  // Learns the layout from the headers; `meta` bounds the number of tensors and bytes.
  // With `write`, the values are not kept but handed to `write` a block (32 KiB) at a time as
  // they arrive, and Finish() returns the model with no values: a model-sized download needs no
  // model-sized buffer. The digest of a tensor is checked when its last byte arrives and the
  // whole stream at Finish(), so what `write` received is verified only once Finish() succeeds.
  // With `base` (the model version meta.xor_base_version, read by element), XOR_SPARSE_ZLIB tensors
  // are taken too: inflated and XORed with the base as they arrive, and checked against the digest
  // of the values they rebuild. Without it an XOR_SPARSE_ZLIB tensor is an error. Without
  // `write`, the values go into `buffer`'s storage (pass a recycled model-sized buffer, as
  // ForLayout; its contents are overwritten).
  static absl::StatusOr<FrameDecoder> ForMeta(const common::v1::ModelMeta& meta,
                                              const DecoderLimits& limits, bool require_finite,
                                              WriteValues write = nullptr,
                                              ReadValues base = nullptr,
                                              std::vector<float> buffer = {});

  FrameDecoder(FrameDecoder&&) noexcept;
  FrameDecoder& operator=(FrameDecoder&&) noexcept;
  ~FrameDecoder();

  absl::Status Add(const common::v1::TensorFrame& frame);
  // Adds one chunk given as consecutive pieces (e.g. the slices of a received gRPC message
  // that were not parsed into a TensorFrame); same checks as Add() with a chunk frame.
  absl::Status AddChunkParts(absl::Span<const absl::string_view> parts);
  // The complete model. Errors if tensors or bytes are missing.
  absl::StatusOr<FlatModel> Finish() &&;

  // Payload bytes (chunk bytes) accepted so far.
  uint64_t bytes_received() const { return bytes_received_; }
  // Sum of squares of the values checked so far (only computed when require_finite): the
  // squared L2 norm of the whole model once Finish() succeeds.
  double sum_squares() const { return sum_squares_; }
  // True when the decoder failed because of a non-finite value (for metrics that tell malformed
  // streams from bad values).
  bool failed_non_finite() const { return failed_non_finite_; }
  // Takes the decode buffer back (e.g. to return it to a pool after an error).
  std::vector<float> ReleaseBuffer() &&;

 private:
  struct DigestState;
  struct DigestStateDeleter {
    void operator()(DigestState* state) const;
  };

  FrameDecoder();
  absl::Status AddHeader(const common::v1::TensorHeader& header);
  absl::Status AddChunk(absl::Span<const absl::string_view> parts);
  // Takes the next float32 bytes of the current tensor (raw, or rebuilt from XOR_SPARSE_ZLIB):
  // copies, digests and checks them and hands them on.
  absl::Status AddValueBytes(absl::string_view part);
  absl::Status CompleteTensor();
  // Checks (when require_finite_, and the current tensor is float32) values
  // [tensor_values_checked_, tensor_values_checked_ + n) of the current tensor, found at `first`,
  // and counts them as checked.
  absl::Status CheckFinite(const float* first, size_t n);
  std::string CurrentName() const;  // escaped, for messages
  absl::Status Fail(absl::Status status);

  std::optional<ModelLayout> expected_;  // set by ForLayout
  uint32_t expected_tensors_ = 0;        // set by ForMeta
  uint64_t expected_total_bytes_ = 0;    // set by ForMeta
  bool require_finite_ = false;
  std::vector<TensorSpec> specs_;  // headers seen so far
  std::vector<float> values_;
  WriteValues write_;         // set: values go there instead of values_ (ForMeta)
  std::vector<float> stage_;  // with write_: the block being decoded, after stage_bytes_ bytes
  size_t stage_bytes_ = 0;    // bytes of a value split across pieces, kept at stage_'s front
  uint64_t values_bytes_used_ = 0;      // bytes of values_ belonging to headers seen so far
  uint64_t tensor_bytes_expected_ = 0;  // payload of the current tensor
  uint64_t tensor_bytes_received_ = 0;
  uint64_t tensor_digest_ = 0;
  size_t tensor_value_offset_ = 0;    // element offset of the current tensor in values_
  size_t tensor_values_checked_ = 0;  // elements of the current tensor checked for finiteness
  bool in_tensor_ = false;
  uint64_t bytes_received_ = 0;
  double sum_squares_ = 0;
  absl::Status failed_;
  bool failed_non_finite_ = false;
  TensorEncoding encoding_;  // of the current tensor
  std::string encoded_;      // a non-raw tensor's payload, decoded once complete (ForLayout)
  ReadValues base_;          // set: XOR_SPARSE_ZLIB tensors are taken (ForMeta)
  XorInflater inflater_;     // of the current XOR_SPARSE_ZLIB tensor
  uint64_t wire_bytes_expected_ = 0;  // XOR_SPARSE_ZLIB: the current tensor's payload (compressed)
  uint64_t wire_bytes_received_ = 0;
  std::unique_ptr<DigestState, DigestStateDeleter> digest_state_;  // XXH3 of the current tensor
};

}  // namespace shoal::tensor
