#include "libs/tensor/frame_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/escape.h"
#include "libs/common/heap.h"
#include "libs/common/status_macros.h"
#include "libs/tensor/compression.h"

namespace shoal::tensor {
namespace {

// Decoded values are copied, digested and checked in blocks of this size (see AddChunk).
constexpr size_t kBlockBytes = 32 << 10;

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; big-endian hosts need byte swapping");

using common::v1::TensorFrame;
using common::v1::TensorHeader;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// Squared L2 norm of `n` floats, and whether all of them are finite. The fast path sums in
// float lanes (vectorizes); a non-finite lane sum means either a NaN/Inf value or an overflow,
// which the slow path tells apart.
struct NormCheck {
  double sum_squares = 0;
  bool finite = true;
  size_t first_bad = 0;
};

NormCheck CheckValues(const float* x, size_t n) {
  constexpr size_t kLanes = 16;
  float lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j] * x[i + j];
  }
  float tail = 0;
  for (; i < n; ++i) tail += x[i] * x[i];
  double total = tail;
  for (size_t j = 0; j < kLanes; ++j) total += lanes[j];
  NormCheck result;
  if (std::isfinite(total)) {
    result.sum_squares = total;
    return result;
  }
  double precise = 0;
  for (size_t k = 0; k < n; ++k) {
    if (!std::isfinite(x[k])) {
      result.finite = false;
      result.first_bad = k;
      return result;
    }
    precise += static_cast<double>(x[k]) * x[k];
  }
  result.sum_squares = precise;
  return result;
}

}  // namespace

common::v1::ModelMeta MakeModelMeta(const std::string& task, uint64_t version,
                                    const ModelLayout& layout) {
  common::v1::ModelMeta meta;
  meta.set_task(task);
  meta.set_version(version);
  meta.set_num_tensors(static_cast<uint32_t>(layout.num_tensors()));
  meta.set_total_bytes(layout.total_bytes());
  return meta;
}

common::v1::ModelMeta MakeModelMeta(const std::string& task, uint64_t version,
                                    const FlatModel& model) {
  return MakeModelMeta(task, version, model.layout);
}

// ---------------------------------------------------------------------------------------------
// FrameEncoder

FrameEncoder::FrameEncoder(const FlatModel& model, size_t chunk_bytes)
    : layout_(model.layout),
      chunk_bytes_(chunk_bytes == 0 ? kDefaultChunkBytes : std::min(chunk_bytes, kMaxChunkBytes)) {
  for (size_t t = 0; t < layout_.num_tensors(); ++t) {
    payloads_.emplace_back(reinterpret_cast<const char*>(model.values.data() + layout_.offset(t)),
                           layout_.tensors()[t].NumElements() * sizeof(float));
  }
}

FrameEncoder::FrameEncoder(const EncodedModel& model, size_t chunk_bytes)
    : layout_(model.layout),
      payloads_(model.payloads),
      encodings_(model.encodings),
      digests_(model.digests),
      chunk_bytes_(chunk_bytes == 0 ? kDefaultChunkBytes : std::min(chunk_bytes, kMaxChunkBytes)) {}

void SetTensorHeader(const TensorSpec& spec, uint64_t size_bytes, uint64_t digest,
                     TensorHeader* header) {
  header->set_name(spec.name);
  header->set_dtype(spec.element == Element::kUint32 ? common::v1::DTYPE_UINT32
                                                     : common::v1::DTYPE_FLOAT32);
  header->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
  header->set_encoding(common::v1::ENCODING_RAW);
  header->set_size_bytes(size_bytes);
  header->set_digest_xxh3(digest);
}

bool FrameEncoder::Next(TensorFrame* frame) {
  if (tensor_ >= layout_.num_tensors()) return false;
  const TensorSpec& spec = layout_.tensors()[tensor_];
  const size_t size = payloads_[tensor_].size();
  const char* data = payloads_[tensor_].data();
  if (!header_sent_) {
    const uint64_t digest = digests_.empty() ? DigestBytes(data, size) : digests_[tensor_];
    SetTensorHeader(spec, size, digest, frame->mutable_header());
    if (!encodings_.empty()) encodings_[tensor_].ToHeader(frame->mutable_header());
    header_sent_ = true;
    byte_offset_ = 0;
    if (size == 0) {
      ++tensor_;
      header_sent_ = false;
    }
    return true;
  }
  const size_t n = std::min(chunk_bytes_, size - byte_offset_);
  frame->mutable_chunk()->assign(data + byte_offset_, n);
  byte_offset_ += n;
  if (byte_offset_ == size) {
    ++tensor_;
    header_sent_ = false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// FrameDecoder

struct FrameDecoder::DigestState {
  XXH3_state_t* state;
};

void FrameDecoder::DigestStateDeleter::operator()(DigestState* s) const {
  if (s == nullptr) return;
  XXH3_freeState(s->state);
  delete s;
}

FrameDecoder::FrameDecoder() : digest_state_(new DigestState{XXH3_createState()}) {}
FrameDecoder::FrameDecoder(FrameDecoder&&) noexcept = default;
FrameDecoder& FrameDecoder::operator=(FrameDecoder&&) noexcept = default;
FrameDecoder::~FrameDecoder() = default;

FrameDecoder FrameDecoder::ForLayout(const ModelLayout& layout, bool require_finite) {
  return ForLayout(layout, require_finite, {});
}

FrameDecoder FrameDecoder::ForLayout(const ModelLayout& layout, bool require_finite,
                                     std::vector<float> buffer) {
  FrameDecoder d;
  d.expected_ = layout;
  d.require_finite_ = require_finite;
  d.values_ = std::move(buffer);
  ReserveLarge(d.values_, layout.total_elements());
  d.values_.resize(layout.total_elements());
  d.specs_.reserve(layout.num_tensors());
  return d;
}

absl::StatusOr<FrameDecoder> FrameDecoder::ForMeta(const common::v1::ModelMeta& meta,
                                                   const DecoderLimits& limits, bool require_finite,
                                                   WriteValues write, ReadValues base,
                                                   std::vector<float> buffer) {
  if (meta.num_tensors() > limits.max_tensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model has ", meta.num_tensors(), " tensors, more than the limit of ", limits.max_tensors));
  }
  if (meta.total_bytes() > limits.max_total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", meta.total_bytes(),
                                                   " bytes, more than the limit of ",
                                                   limits.max_total_bytes));
  }
  if (meta.total_bytes() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model total_bytes ", meta.total_bytes(), " is not a multiple of 4"));
  }
  FrameDecoder d;
  d.expected_tensors_ = meta.num_tensors();
  d.expected_total_bytes_ = meta.total_bytes();
  d.require_finite_ = require_finite;
  d.base_ = std::move(base);
  if (write) {
    d.write_ = std::move(write);
    d.stage_.resize(kBlockBytes / sizeof(float) + 1);
  } else {
    d.values_ = std::move(buffer);
    d.values_.clear();  // the tensors' values are appended as their headers arrive
    ReserveLarge(d.values_, meta.total_bytes() / sizeof(float));
  }
  d.specs_.reserve(meta.num_tensors());
  return d;
}

absl::Status FrameDecoder::Fail(absl::Status status) {
  failed_ = status;
  return status;
}

std::string FrameDecoder::CurrentName() const { return EscapeBytes(specs_.back().name); }

absl::Status FrameDecoder::Add(const TensorFrame& frame) {
  if (!failed_.ok()) return failed_;
  switch (frame.frame_case()) {
    case TensorFrame::kHeader:
      return AddHeader(frame.header());
    case TensorFrame::kChunk: {
      const absl::string_view part(frame.chunk());
      return AddChunk(absl::MakeConstSpan(&part, 1));
    }
    default:
      return Fail(absl::InvalidArgumentError("empty TensorFrame (neither header nor chunk)"));
  }
}

absl::Status FrameDecoder::AddHeader(const TensorHeader& header) {
  const std::string& name = header.name();
  const std::string shown = EscapeBytes(name);  // for messages
  if (in_tensor_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor '", CurrentName(), "' is incomplete (", wire_bytes_received_, " of ",
                     wire_bytes_expected_, " bytes) when the header of '", shown, "' arrived")));
  }
  if (name.empty()) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("tensor #", specs_.size(), " has an empty name")));
  }
  const bool ring = header.dtype() == common::v1::DTYPE_UINT32;
  if (header.dtype() != common::v1::DTYPE_FLOAT32 && !ring) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", shown, "': dtype ", common::v1::DType_Name(header.dtype()),
        " is not supported (want DTYPE_FLOAT32, or DTYPE_UINT32 in a masked update)")));
  }
  const TensorEncoding encoding = TensorEncoding::Of(header);
  if (ring && (encoding.encoding != common::v1::ENCODING_RAW || !expected_.has_value())) {
    // Only a masked update carries ring values, raw, and its receiver knows its layout.
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", shown, "': DTYPE_UINT32 ",
        expected_.has_value() ? "must be ENCODING_RAW" : "where a model of float32 was expected")));
  }
  const bool xor_zlib = encoding.encoding == common::v1::ENCODING_XOR_SPARSE_ZLIB;
  if (xor_zlib && !base_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", shown, "': ENCODING_XOR_SPARSE_ZLIB but the download has no base model")));
  }
  if (encoding.encoding != common::v1::ENCODING_RAW && !xor_zlib && !expected_.has_value()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", shown, "': encoding ", common::v1::Encoding_Name(header.encoding()),
        " is only accepted in updates (a model travels as ENCODING_RAW)")));
  }
  TensorSpec spec{name, std::vector<int64_t>(header.shape().begin(), header.shape().end()),
                  ring ? Element::kUint32 : Element::kFloat32};
  if (spec.shape.size() > 16) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor '", shown, "': ", spec.shape.size(), " dimensions is too many")));
  }
  // Element count with overflow checks (shapes come from the network).
  constexpr uint64_t kMaxElements = uint64_t{1} << 40;
  uint64_t elements = 1;
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", shown, "': negative dimension in shape ", ShapeString(spec.shape))));
    }
    if (d != 0 && elements > kMaxElements / static_cast<uint64_t>(d)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor '", shown, "': shape ", ShapeString(spec.shape), " is too large")));
    }
    elements *= static_cast<uint64_t>(d);
  }
  const uint64_t size = elements * sizeof(float);
  if (encoding.encoding == common::v1::ENCODING_RAW && header.size_bytes() != size) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", shown, "': size_bytes ", header.size_bytes(), " does not match shape ",
        ShapeString(spec.shape), " of float32 (", size, " bytes)")));
  }
  if (absl::Status s = CheckEncodedSize(encoding, elements, header.size_bytes()); !s.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("tensor '", shown, "': ", s.message())));
  }

  const size_t index = specs_.size();
  if (expected_.has_value()) {
    const ModelLayout& layout = *expected_;
    if (index >= layout.num_tensors()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("unexpected extra tensor '", shown,
                                                          "': the model has ", layout.num_tensors(),
                                                          " tensors")));
    }
    const TensorSpec& want = layout.tensors()[index];
    if (want.name != name) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("tensor #", index, " is '", shown,
                                                          "' but the model expects '",
                                                          EscapeBytes(want.name), "'")));
    }
    if (want.shape != spec.shape) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor '", shown, "': shape ", ShapeString(spec.shape),
                       " does not match the model's ", ShapeString(want.shape))));
    }
    if (want.element != spec.element) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", shown, "': dtype ", common::v1::DType_Name(header.dtype()), " but a ",
          want.element == Element::kUint32 ? "masked update (DTYPE_UINT32)" : "float32",
          " tensor was expected")));
    }
    tensor_value_offset_ = layout.offset(index);
  } else {
    if (index >= expected_tensors_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("unexpected extra tensor '", shown,
                                                          "': ModelMeta announced ",
                                                          expected_tensors_, " tensors")));
    }
    for (const TensorSpec& seen : specs_) {
      if (seen.name == name) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("tensor '", shown, "' appears twice in the stream")));
      }
    }
    if (values_bytes_used_ + size > expected_total_bytes_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("tensor '", shown, "' (", size,
                                                          " bytes) exceeds ModelMeta total_bytes ",
                                                          expected_total_bytes_)));
    }
    tensor_value_offset_ = values_bytes_used_ / sizeof(float);
    if (!write_) values_.resize(tensor_value_offset_ + elements);
  }
  values_bytes_used_ += size;
  specs_.push_back(std::move(spec));
  tensor_bytes_expected_ = xor_zlib ? size : header.size_bytes();
  tensor_bytes_received_ = 0;
  wire_bytes_expected_ = header.size_bytes();
  wire_bytes_received_ = 0;
  if (xor_zlib) {
    if (absl::Status s = inflater_.Start(base_, tensor_value_offset_, elements); !s.ok()) {
      return Fail(s);
    }
  }
  encoding_ = encoding;
  encoded_.clear();
  tensor_values_checked_ = 0;
  stage_bytes_ = 0;
  tensor_digest_ = header.digest_xxh3();
  in_tensor_ = true;
  XXH3_64bits_reset(digest_state_->state);
  if (wire_bytes_expected_ == 0) return CompleteTensor();
  return absl::OkStatus();
}

absl::Status FrameDecoder::AddChunkParts(absl::Span<const absl::string_view> parts) {
  if (!failed_.ok()) return failed_;
  return AddChunk(parts);
}

absl::Status FrameDecoder::AddChunk(absl::Span<const absl::string_view> parts) {
  if (!in_tensor_) {
    if (specs_.empty()) {
      return Fail(absl::InvalidArgumentError("chunk before any tensor header"));
    }
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("chunk after tensor '", CurrentName(), "' was already complete")));
  }
  size_t n = 0;
  for (absl::string_view part : parts) n += part.size();
  if (n > kMaxChunkBytes) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("tensor '", CurrentName(), "': chunk of ", n,
                                                " bytes exceeds the limit of ", kMaxChunkBytes)));
  }
  if (n > wire_bytes_expected_ - wire_bytes_received_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor '", CurrentName(), "': chunks exceed size_bytes ",
                     wire_bytes_expected_, " (", wire_bytes_received_ + n, " bytes received)")));
  }
  wire_bytes_received_ += n;
  bytes_received_ += n;
  if (encoding_.encoding == common::v1::ENCODING_XOR_SPARSE_ZLIB) {
    const auto take = [this](absl::string_view bytes) { return AddValueBytes(bytes); };
    for (absl::string_view part : parts) {
      if (absl::Status s = inflater_.Feed(part, take); !s.ok()) {
        return failed_.ok() ? Fail(absl::InvalidArgumentError(
                                  absl::StrCat("tensor '", CurrentName(), "': ", s.message())))
                            : failed_;
      }
    }
    if (wire_bytes_received_ < wire_bytes_expected_) return absl::OkStatus();
    if (absl::Status s = inflater_.Finish(); !s.ok()) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("tensor '", CurrentName(), "': ", s.message())));
    }
    return CompleteTensor();
  }
  if (encoding_.encoding != common::v1::ENCODING_RAW) {
    // An encoded tensor (bounded by its raw size) is collected and decoded once complete.
    for (absl::string_view part : parts) {
      encoded_.append(part.data(), part.size());
      XXH3_64bits_update(digest_state_->state, part.data(), part.size());
    }
    tensor_bytes_received_ += n;
    if (tensor_bytes_received_ == tensor_bytes_expected_) return CompleteTensor();
    return absl::OkStatus();
  }
  for (absl::string_view part : parts) SHOAL_RETURN_IF_ERROR(AddValueBytes(part));
  if (tensor_bytes_received_ == tensor_bytes_expected_) return CompleteTensor();
  return absl::OkStatus();
}

absl::Status FrameDecoder::AddValueBytes(absl::string_view part) {
  // Copy, digest and check block by block rather than pass by pass over the whole chunk: each
  // block is digested and checked right after its copy, while it is still in L1, so nothing
  // reads the (cold, model-sized) staging buffer back from memory. With write_ the block is
  // copied into stage_ instead and handed on from there.
  char* const base = reinterpret_cast<char*>(values_.data() + tensor_value_offset_);
  while (!part.empty()) {
    const size_t take = std::min(kBlockBytes, part.size());
    char* const stage = reinterpret_cast<char*>(stage_.data());
    char* dest = write_ ? stage + stage_bytes_ : base + tensor_bytes_received_;
    std::memcpy(dest, part.data(), take);
    part.remove_prefix(take);
    XXH3_64bits_update(digest_state_->state, dest, take);
    tensor_bytes_received_ += take;
    if (write_) {
      // Whole values go on; the bytes of one split across pieces wait at the front.
      const size_t staged = stage_bytes_ + take;
      const size_t whole = staged / sizeof(float);
      const size_t first = tensor_values_checked_;
      SHOAL_RETURN_IF_ERROR(CheckFinite(stage_.data(), whole));
      if (absl::Status s =
              write_(tensor_value_offset_ + first, absl::MakeConstSpan(stage_.data(), whole));
          !s.ok()) {
        return Fail(s);
      }
      stage_bytes_ = staged - whole * sizeof(float);
      std::memmove(stage, stage + whole * sizeof(float), stage_bytes_);
    } else {
      // Only whole floats: a piece may end inside one, which the next piece completes.
      const size_t complete = tensor_bytes_received_ / sizeof(float);
      SHOAL_RETURN_IF_ERROR(
          CheckFinite(values_.data() + tensor_value_offset_ + tensor_values_checked_,
                      complete - tensor_values_checked_));
    }
  }
  return absl::OkStatus();
}

absl::Status FrameDecoder::CheckFinite(const float* first, size_t n) {
  if (require_finite_ && specs_.back().element == Element::kFloat32) {
    NormCheck check = CheckValues(first, n);
    if (!check.finite) {
      const size_t index = tensor_values_checked_ + check.first_bad;
      failed_non_finite_ = true;
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("tensor '", CurrentName(), "': non-finite value ",
                                                  first[check.first_bad], " at element ", index)));
    }
    sum_squares_ += check.sum_squares;
  }
  tensor_values_checked_ += n;
  return absl::OkStatus();
}

absl::Status FrameDecoder::CompleteTensor() {
  in_tensor_ = false;
  const uint64_t digest = XXH3_64bits_digest(digest_state_->state);
  if (digest != tensor_digest_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor '", CurrentName(), "': digest mismatch (header says ",
                     absl::Hex(tensor_digest_), ", payload is ", absl::Hex(digest), ")")));
  }
  if (encoding_.encoding != common::v1::ENCODING_RAW &&
      encoding_.encoding != common::v1::ENCODING_XOR_SPARSE_ZLIB) {
    float* const out = values_.data() + tensor_value_offset_;
    const size_t elements = static_cast<size_t>(specs_.back().NumElements());
    if (absl::Status s = DecodeTensor(encoding_, encoded_, absl::MakeSpan(out, elements));
        !s.ok()) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("tensor '", CurrentName(), "': ", s.message())));
    }
    tensor_values_checked_ = 0;
    SHOAL_RETURN_IF_ERROR(CheckFinite(out, elements));
  }
  return absl::OkStatus();
}

absl::StatusOr<FlatModel> FrameDecoder::Finish() && {
  if (!failed_.ok()) return failed_;
  if (in_tensor_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("stream ended inside tensor '",
                                                        CurrentName(), "' (", wire_bytes_received_,
                                                        " of ", wire_bytes_expected_, " bytes)")));
  }
  FlatModel model;
  if (expected_.has_value()) {
    if (specs_.size() != expected_->num_tensors()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "stream ended after ", specs_.size(), " of ", expected_->num_tensors(),
          " tensors; missing '", EscapeBytes(expected_->tensors()[specs_.size()].name), "'")));
    }
    model.layout = *expected_;
  } else {
    if (specs_.size() != expected_tensors_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("stream ended after ", specs_.size(),
                                                          " of ", expected_tensors_,
                                                          " tensors announced by ModelMeta")));
    }
    if (values_bytes_used_ != expected_total_bytes_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("stream carried ", values_bytes_used_,
                                                          " bytes but ModelMeta announced ",
                                                          expected_total_bytes_)));
    }
    auto layout = ModelLayout::Create(std::move(specs_));
    if (!layout.ok()) return Fail(layout.status());
    model.layout = *std::move(layout);
  }
  model.values = std::move(values_);
  return model;
}

std::vector<float> FrameDecoder::ReleaseBuffer() && { return std::move(values_); }

}  // namespace shoal::tensor
