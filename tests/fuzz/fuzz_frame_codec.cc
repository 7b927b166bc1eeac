// The chunked tensor stream codec (FrameDecoder), fed a stream of frames built from the input:
// raw TensorFrame messages parsed from bytes, raw chunks, chunks in pieces, and well-formed
// header+payload pairs, raw or in an update encoding (fp16, int8, sparse), with a correct digest
// unless the input says otherwise, so that the fuzzer gets past the digest check and into the
// decoders of compression.h. A model decoder may hold a base model, so that XOR_SPARSE_ZLIB tensors
// (xor_delta.h) come as zlib streams of fuzzed bits (or as fuzzed bytes) with the digest of the
// values they rebuild. A stream that decodes must hold exactly its layout's values (finite ones
// when required) and survive a re-encode/decode round trip bit for bit.

#include <fuzzer/FuzzedDataProvider.h>
#include <zlib.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "libs/common/status_macros.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/xor_delta.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_log.h"

namespace shoal::tensor {
namespace {

using common::v1::TensorFrame;

const ModelLayout& KnownLayout() {
  static const ModelLayout* layout =
      new ModelLayout(*ModelLayout::Create({{"w", {2, 3}}, {"b", {3}}}));
  return *layout;
}

// Every value of the base model a decoder may hold: the same bits everywhere, so that what an
// XOR_SPARSE_ZLIB tensor rebuilds does not depend on where the decoder puts it.
constexpr uint32_t kBaseBits = 0x3f800000;  // 1.0f

absl::Status ReadBase(size_t, absl::Span<float> out) {
  float one;
  std::memcpy(&one, &kBaseBits, sizeof one);
  for (float& v : out) v = one;
  return absl::OkStatus();
}

// An XOR_SPARSE_ZLIB payload for `elements` values and the digest of what it rebuilds: the deflated
// XOR of fuzzed values with the base, or (sometimes) fuzzed bytes and any digest.
std::string XorPayload(FuzzedDataProvider& in, uint64_t elements, uint64_t* digest) {
  if (in.ConsumeProbability<float>() < 0.2f) {
    *digest = in.ConsumeIntegral<uint64_t>();
    return in.ConsumeRandomLengthString(64);
  }
  std::vector<uint32_t> values(elements);
  for (uint32_t& v : values) v = in.ConsumeBool() ? kBaseBits : in.ConsumeIntegral<uint32_t>();
  *digest = DigestBytes(values.data(), values.size() * sizeof(uint32_t));
  // One block (at most 4,096 values here), laid out as tensor.proto says.
  std::vector<uint32_t> x(values.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = values[i] ^ kBaseBits;
  std::vector<uint8_t> block(XorBlockBound(x.size()));
  const size_t len = WriteXorBlock(x, block.data());
  uLongf size = compressBound(len);
  std::string out(size, '\0');
  if (compress(reinterpret_cast<Bytef*>(out.data()), &size, block.data(), len) != Z_OK) {
    return "";
  }
  out.resize(size);
  return out;
}

// Adds a well-formed tensor: its header, then its payload in chunks or pieces.
absl::Status AddTensor(FuzzedDataProvider& in, FrameDecoder& decoder) {
  TensorFrame header_frame;
  common::v1::TensorHeader& header = *header_frame.mutable_header();
  const bool known = in.ConsumeBool();
  uint64_t elements = 1;
  if (known) {
    const TensorSpec& spec = KnownLayout().tensors()[in.ConsumeIntegralInRange<size_t>(0, 1)];
    header.set_name(spec.name);
    for (int64_t d : spec.shape) header.add_shape(d);
    elements = static_cast<uint64_t>(spec.NumElements());
  } else {
    header.set_name(in.ConsumeRandomLengthString(12));
    const int dims = in.ConsumeIntegralInRange(0, 3);
    for (int i = 0; i < dims; ++i) {
      const int64_t d = in.ConsumeIntegralInRange<int64_t>(0, 16);
      header.add_shape(d);
      elements *= static_cast<uint64_t>(d);
    }
  }
  header.set_dtype(common::v1::DTYPE_FLOAT32);
  // Raw, or one of the update encodings (compression.h) with the size it should have (a sparse
  // tensor: any size up to the raw one).
  const auto encoding = static_cast<common::v1::Encoding>(in.ConsumeIntegralInRange(1, 5));
  header.set_encoding(encoding);
  uint64_t size = elements * sizeof(float);
  if (encoding == common::v1::ENCODING_FP16) size = 2 * elements;
  if (encoding == common::v1::ENCODING_INT8) size = elements == 0 ? 0 : 4 + elements;
  if (encoding == common::v1::ENCODING_SPARSE) {
    header.set_values_encoding(static_cast<common::v1::Encoding>(in.ConsumeIntegralInRange(0, 4)));
    header.set_nonzeros(in.ConsumeIntegralInRange<uint64_t>(0, elements + 1));
    size = in.ConsumeIntegralInRange<uint64_t>(0, elements * sizeof(float) + 1);
  }
  std::string payload;
  uint64_t digest = 0;
  if (encoding == common::v1::ENCODING_XOR_SPARSE_ZLIB) {
    payload = XorPayload(in, elements, &digest);
    size = payload.size();
  } else {
    payload = in.ConsumeBytesAsString(size);
    payload.resize(size, '\0');
    digest = DigestBytes(payload.data(), payload.size());
  }
  header.set_size_bytes(size);
  if (in.ConsumeProbability<float>() < 0.05f) digest ^= 1;
  header.set_digest_xxh3(digest);
  SHOAL_RETURN_IF_ERROR(decoder.Add(header_frame));
  absl::string_view rest(payload);
  while (!rest.empty()) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(1, rest.size());
    if (in.ConsumeBool()) {
      TensorFrame chunk;
      chunk.set_chunk(std::string(rest.substr(0, n)));
      SHOAL_RETURN_IF_ERROR(decoder.Add(chunk));
    } else {
      const size_t cut = in.ConsumeIntegralInRange<size_t>(0, n);
      const absl::string_view parts[] = {rest.substr(0, cut), rest.substr(cut, n - cut)};
      SHOAL_RETURN_IF_ERROR(decoder.AddChunkParts(parts));
    }
    rest.remove_prefix(n);
  }
  return absl::OkStatus();
}

// nullopt when the input held no frame (bytes that do not parse as one).
std::optional<absl::Status> AddOne(FuzzedDataProvider& in, FrameDecoder& decoder) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: {
      TensorFrame frame;
      if (!frame.ParseFromString(in.ConsumeRandomLengthString(4096))) return std::nullopt;
      return decoder.Add(frame);
    }
    case 1: {
      TensorFrame frame;
      frame.set_chunk(in.ConsumeRandomLengthString(512));
      return decoder.Add(frame);
    }
    case 2: {
      const std::string a = in.ConsumeRandomLengthString(64);
      const std::string b = in.ConsumeRandomLengthString(64);
      const absl::string_view parts[] = {a, b};
      return decoder.AddChunkParts(parts);
    }
    default:
      return AddTensor(in, decoder);
  }
}

void CheckModel(const FlatModel& model, bool require_finite) {
  SHOAL_FUZZ_CHECK(model.values.size() == model.layout.total_elements());
  if (require_finite) {
    for (float v : model.values) SHOAL_FUZZ_CHECK(std::isfinite(v));
  }
  // Re-encode in small chunks and decode against the layout: the same bits come back.
  FrameEncoder encoder(model, 12);
  FrameDecoder again = FrameDecoder::ForLayout(model.layout, require_finite);
  TensorFrame frame;
  while (encoder.Next(&frame)) {
    SHOAL_FUZZ_CHECK(again.Add(frame).ok());
    frame.Clear();
  }
  absl::StatusOr<FlatModel> back = std::move(again).Finish();
  SHOAL_FUZZ_CHECK(back.ok());
  SHOAL_FUZZ_CHECK(back->layout == model.layout);
  SHOAL_FUZZ_CHECK(back->values.size() == model.values.size());
  SHOAL_FUZZ_CHECK(model.values.empty() || std::memcmp(back->values.data(), model.values.data(),
                                                       model.values.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace shoal::tensor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  shoal::fuzz::LogOnlyWhenReplaying(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::tensor;
  FuzzedDataProvider in(data, size);
  const bool by_layout = in.ConsumeBool();
  const bool require_finite = in.ConsumeBool();
  std::optional<FrameDecoder> decoder;
  if (by_layout) {
    decoder.emplace(FrameDecoder::ForLayout(KnownLayout(), require_finite));
  } else {
    shoal::common::v1::ModelMeta meta;
    meta.set_num_tensors(in.ConsumeIntegralInRange<uint32_t>(0, 10));
    meta.set_total_bytes(in.ConsumeIntegralInRange<uint64_t>(0, 1 << 14));
    DecoderLimits limits;
    limits.max_tensors = 8;
    limits.max_total_bytes = 1 << 13;
    const bool with_base = in.ConsumeBool();
    absl::StatusOr<FrameDecoder> made = FrameDecoder::ForMeta(
        meta, limits, require_finite, nullptr, with_base ? ReadValues(ReadBase) : nullptr);
    shoal::fuzz::CheckErrorIsClean(made.status());
    if (!made.ok()) return 0;
    decoder.emplace(*std::move(made));
  }
  absl::Status first_error;
  const int frames = in.ConsumeIntegralInRange(0, 24);
  for (int i = 0; i < frames && in.remaining_bytes() > 0; ++i) {
    const std::optional<absl::Status> added = AddOne(in, *decoder);
    if (!added.has_value()) continue;
    const absl::Status& s = *added;
    shoal::fuzz::CheckErrorIsClean(s);
    // After the first error, every later call returns that error.
    if (!first_error.ok()) SHOAL_FUZZ_CHECK(s == first_error);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  if (in.ConsumeBool()) {
    std::vector<float> buffer = std::move(*decoder).ReleaseBuffer();
    return 0;
  }
  absl::StatusOr<FlatModel> model = std::move(*decoder).Finish();
  shoal::fuzz::CheckErrorIsClean(model.status());
  if (!first_error.ok()) SHOAL_FUZZ_CHECK(model.status() == first_error);
  if (!model.ok()) return 0;
  if (by_layout) SHOAL_FUZZ_CHECK(model->layout == KnownLayout());
  CheckModel(*model, require_finite);
  return 0;
}
