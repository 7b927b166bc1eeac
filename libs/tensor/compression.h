#pragma once

// Compressed updates: the encodings of tensor.proto (FP16, INT8, SPARSE) and a per-peer
// compressor with an error-feedback residual. Models travel raw or XOR_SPARSE_ZLIB (xor_delta.h);
// only updates (deltas) are compressed this way, and the receiver's FrameDecoder decodes them back
// to float32 with the same checks as raw ones (sizes, digests, finite values) plus the encodings'
// own (indices in range and increasing, a finite scale, int8 in [-127, 127]).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/model_file.h"
#include "shoal/common/v1/tensor.pb.h"

namespace shoal::tensor {

// How one tensor travels (TensorHeader.encoding, values_encoding and nonzeros).
struct TensorEncoding {
  common::v1::Encoding encoding = common::v1::ENCODING_RAW;
  common::v1::Encoding values_encoding = common::v1::ENCODING_UNSPECIFIED;  // SPARSE only
  uint64_t nonzeros = 0;                                                    // SPARSE only

  static TensorEncoding Of(const common::v1::TensorHeader& header);
  void ToHeader(common::v1::TensorHeader* header) const;
};

// A model or update as it travels: each tensor's encoding and payload bytes. Built in place
// behind a shared_ptr and never moved after (the payloads may point into `storage`).
struct EncodedModel {
  ModelLayout layout;
  std::vector<TensorEncoding> encodings;    // one per tensor
  std::vector<absl::string_view> payloads;  // one per tensor, into `storage` or `owner`
  // One per tensor, or empty: each header's digest_xxh3, when it is not the payload's XXH3
  // (XOR_SPARSE_ZLIB tensors carry their values' digest) or was computed before (EncodeRaw's
  // `digests`); empty, a stream hashes each payload as it sends it.
  std::vector<uint64_t> digests;
  std::vector<std::string> storage;
  std::shared_ptr<const void> owner;

  uint64_t payload_bytes() const;
  // The values the payloads carry: each dense tensor's elements, a sparse one's nonzeros.
  uint64_t values_sent() const;
};

// `model` raw (float32), without a copy: the payloads are views of the model's values.
// `digests`: each tensor's XXH3 when already known (TensorDigests), or empty.
std::shared_ptr<const EncodedModel> EncodeRaw(std::shared_ptr<const FlatModel> model,
                                              std::vector<uint64_t> digests = {});

// A mapped model file raw, without a copy: the payloads are views of the file's pages.
std::shared_ptr<const EncodedModel> EncodeRaw(std::shared_ptr<const MappedModelFile> file);

// The XXH3 of each tensor of one model, computed by the first call and kept, so that a model
// served raw many times (a published version, a peer's snapshot) is hashed once, not by each
// stream. Thread-safe: a call made while the first computes waits for it.
class TensorDigests {
 public:
  // `model`: the same model on every call.
  const std::vector<uint64_t>& Of(const FlatModel& model);

 private:
  absl::once_flag once_;
  std::vector<uint64_t> digests_;
};

// The payload size a tensor of `elements` values may have in encoding `e`. Never more than the
// raw size (a sender falls back to raw rather than send more). INVALID_ARGUMENT naming what is
// wrong (the caller adds the tensor's name).
absl::Status CheckEncodedSize(const TensorEncoding& e, uint64_t elements, uint64_t size_bytes);

// Decodes a payload (whose size passed CheckEncodedSize) into `out` (one float per element,
// every element written). Not XOR_SPARSE_ZLIB, which needs the base model (XorInflater).
// INVALID_ARGUMENT for an index out of range or not increasing, a truncated or overlong varint, a
// bad scale or an int8 of -128. Values are not checked for finiteness here (the decoder does, for
// raw and decoded values alike).
absl::Status DecodeTensor(const TensorEncoding& e, absl::string_view payload,
                          absl::Span<float> out);

// The whole model back as float32 (tests, in-process fakes).
absl::StatusOr<FlatModel> DecodeModel(const EncodedModel& model);

// IEEE binary16 conversions. FloatToHalf rounds to nearest even and clamps finite values beyond
// the half range to +-65504; infinities and NaN stay infinite and NaN.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);

// How top-k shares its kept values out between the tensors it sparsifies (task.proto TopkSplit).
enum class TopKSplit {
  kPerTensor,  // the ratio of each tensor
  kEqual,      // the same total, the same number of each (capped at a tensor's size)
};

// The values top-k keeps of each tensor, for tensors of `sizes` values (0 for a tensor top-k
// does not sparsify: its count is 0). kPerTensor: ceil(ratio x size), at least 1. kEqual: the
// sum of those counts split equally, smallest tensors first, so that what a tensor smaller than
// its share cannot take goes to the larger ones; the same total. Each count is in 1..size.
std::vector<uint64_t> TopKCounts(absl::Span<const uint64_t> sizes, double ratio, TopKSplit split);

// How a peer compresses its updates: a codec among RAW (none), FP16, INT8 and SPARSE (top-k),
// for SPARSE the fraction of each tensor's values kept and how they are encoded.
struct CompressionSettings {
  common::v1::Encoding codec = common::v1::ENCODING_RAW;
  double topk_ratio = 0.01;                                     // SPARSE: (0, 1]
  common::v1::Encoding topk_values = common::v1::ENCODING_RAW;  // SPARSE: RAW, FP16, INT8
  // SPARSE: updates trained from the first `topk_warmup_rounds` model versions (0 .. N-1) keep
  // a larger fraction, halving towards topk_ratio: min(1, topk_ratio x 2^(N - v)) for version v.
  uint32_t topk_warmup_rounds = 0;
  // SPARSE: tensors of fewer values are sent whole in `topk_values` (their rounding error still
  // goes to the residual). 0: every tensor is sparsified.
  uint32_t topk_min_elements = 0;
  TopKSplit topk_split = TopKSplit::kPerTensor;  // SPARSE: see TopKCounts
};

// Compresses one peer's successive updates. Top-k keeps, per value, what it did not send (the
// error-feedback residual, one model of memory) and adds it to the next update, so every
// gradient step reaches the model eventually. Per tensor, top-k falls back to its values
// encoding sent dense when the sparse form would not be smaller. Not thread-safe.
class Compressor {
 public:
  explicit Compressor(CompressionSettings settings) : settings_(settings) {}

  const CompressionSettings& settings() const { return settings_; }
  // The fraction of the sparsified values top-k keeps for an update trained from model
  // `base_version`: topk_ratio, more during the warm-up (see CompressionSettings).
  double TopKRatio(uint64_t base_version) const;
  // Encodes `update` (consumed: it holds the update plus the residual afterwards), trained from
  // model `base_version`. For RAW the result is `update` itself, uncopied.
  std::shared_ptr<const EncodedModel> Compress(std::shared_ptr<FlatModel> update,
                                               uint64_t base_version);
  // The residual's squared L2 norm (0 without top-k): what is still waiting to be sent.
  double ResidualSumSquares() const;

 private:
  CompressionSettings settings_;
  std::vector<float> residual_;  // SPARSE only, sized at the first update
};

}  // namespace shoal::tensor
