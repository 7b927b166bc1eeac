#include "libs/tensor/compression.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace shoal::tensor {
namespace {

using common::v1::Encoding;

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; big-endian hosts need byte swapping");

constexpr size_t kMaxVarintBytes = 10;

bool IsValueEncoding(Encoding e) {
  return e == common::v1::ENCODING_RAW || e == common::v1::ENCODING_FP16 ||
         e == common::v1::ENCODING_INT8;
}

// Bytes of `n` values in a values encoding.
uint64_t ValuesBytes(Encoding e, uint64_t n) {
  switch (e) {
    case common::v1::ENCODING_FP16:
      return 2 * n;
    case common::v1::ENCODING_INT8:
      return sizeof(float) + n;
    default:
      return sizeof(float) * n;
  }
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void AppendVarint(uint64_t v, std::string& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Reads one varint from `in` (advancing it); false when truncated or longer than 10 bytes.
bool ReadVarint(absl::string_view& in, uint64_t* value) {
  uint64_t v = 0;
  for (size_t i = 0; i < kMaxVarintBytes && i < in.size(); ++i) {
    const auto byte = static_cast<uint8_t>(in[i]);
    if (i == kMaxVarintBytes - 1 && byte > 1) return false;  // beyond 64 bits
    v |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      in.remove_prefix(i + 1);
      *value = v;
      return true;
    }
  }
  return false;
}

// Appends `values` in a values encoding.
void EncodeValues(Encoding e, absl::Span<const float> values, std::string& out) {
  const size_t start = out.size();
  switch (e) {
    case common::v1::ENCODING_FP16: {
      out.resize(start + 2 * values.size());
      char* p = out.data() + start;
      for (float v : values) {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(p, &h, 2);
        p += 2;
      }
      return;
    }
    case common::v1::ENCODING_INT8: {
      float max_abs = 0;
      for (float v : values) max_abs = std::max(max_abs, std::fabs(v));
      const float scale = std::isfinite(max_abs) ? max_abs / 127.0f : max_abs;
      out.resize(start + sizeof(float) + values.size());
      std::memcpy(out.data() + start, &scale, sizeof(float));
      auto* q = reinterpret_cast<int8_t*>(out.data() + start + sizeof(float));
      for (float v : values) {
        const float r = scale > 0 ? std::nearbyint(v / scale) : 0.0f;
        *q++ = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      }
      return;
    }
    default:
      out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
}

// Decodes `out.size()` values of a values encoding from exactly `in`.
absl::Status DecodeValues(Encoding e, absl::string_view in, absl::Span<float> out) {
  switch (e) {
    case common::v1::ENCODING_FP16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, in.data() + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return absl::OkStatus();
    case common::v1::ENCODING_INT8: {
      float scale;
      std::memcpy(&scale, in.data(), sizeof(float));
      if (!std::isfinite(scale) || scale < 0) {
        return absl::InvalidArgumentError(absl::StrCat("int8 scale ", scale, " is not >= 0"));
      }
      const auto* q = reinterpret_cast<const int8_t*>(in.data() + sizeof(float));
      for (size_t i = 0; i < out.size(); ++i) {
        if (q[i] == -128) {
          return absl::InvalidArgumentError(
              absl::StrCat("int8 value -128 at position ", i, " (the range is [-127, 127])"));
        }
        out[i] = static_cast<float>(q[i]) * scale;
      }
      return absl::OkStatus();
    }
    default:
      std::memcpy(out.data(), in.data(), out.size() * sizeof(float));
      return absl::OkStatus();
  }
}

// The encoded form of one tensor `d` under top-k: its k largest magnitudes (ties by index),
// 1 <= k <= d.size().
void EncodeTopK(absl::Span<const float> d, size_t k, Encoding values, std::string& payload,
                TensorEncoding& encoding, std::vector<float>& scratch) {
  const size_t n = d.size();
  scratch.resize(n);
  for (size_t i = 0; i < n; ++i) scratch[i] = std::fabs(d[i]);
  std::nth_element(scratch.begin(), scratch.begin() + (n - k), scratch.end());
  const float threshold = scratch[n - k];
  size_t above = 0;
  for (float v : d) above += std::fabs(v) > threshold;
  size_t ties = k - above;  // elements equal to the threshold that are kept, first ones first
  std::vector<uint64_t> kept;
  kept.reserve(k);
  for (size_t i = 0; i < n && kept.size() < k; ++i) {
    const float a = std::fabs(d[i]);
    if (a > threshold || (a == threshold && ties > 0)) {
      if (!(a > threshold)) --ties;
      kept.push_back(i);
    }
  }
  size_t index_bytes = 0;
  for (size_t j = 0; j < kept.size(); ++j) {
    index_bytes += VarintSize(j == 0 ? kept[0] : kept[j] - kept[j - 1]);
  }
  if (index_bytes + ValuesBytes(values, kept.size()) >= ValuesBytes(values, n)) {
    encoding = TensorEncoding{values, common::v1::ENCODING_UNSPECIFIED, 0};
    EncodeValues(values, d, payload);
    return;
  }
  encoding = TensorEncoding{common::v1::ENCODING_SPARSE, values, kept.size()};
  for (size_t j = 0; j < kept.size(); ++j) {
    AppendVarint(j == 0 ? kept[0] : kept[j] - kept[j - 1], payload);
  }
  scratch.resize(kept.size());
  for (size_t j = 0; j < kept.size(); ++j) scratch[j] = d[kept[j]];
  EncodeValues(values, scratch, payload);
}

}  // namespace

TensorEncoding TensorEncoding::Of(const common::v1::TensorHeader& header) {
  return TensorEncoding{header.encoding(), header.values_encoding(), header.nonzeros()};
}

void TensorEncoding::ToHeader(common::v1::TensorHeader* header) const {
  header->set_encoding(encoding);
  if (encoding == common::v1::ENCODING_SPARSE) {
    header->set_values_encoding(values_encoding);
    header->set_nonzeros(nonzeros);
  }
}

uint64_t EncodedModel::payload_bytes() const {
  uint64_t total = 0;
  for (absl::string_view p : payloads) total += p.size();
  return total;
}

uint64_t EncodedModel::values_sent() const {
  uint64_t total = 0;
  for (size_t t = 0; t < encodings.size(); ++t) {
    total += encodings[t].encoding == common::v1::ENCODING_SPARSE
                 ? encodings[t].nonzeros
                 : layout.tensors()[t].NumElements();
  }
  return total;
}

std::shared_ptr<const EncodedModel> EncodeRaw(std::shared_ptr<const FlatModel> model,
                                              std::vector<uint64_t> digests) {
  auto encoded = std::make_shared<EncodedModel>();
  encoded->layout = model->layout;
  const ModelLayout& layout = model->layout;
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    encoded->encodings.emplace_back();
    encoded->payloads.emplace_back(
        reinterpret_cast<const char*>(model->values.data() + layout.offset(t)),
        layout.tensors()[t].NumElements() * sizeof(float));
  }
  if (digests.size() == layout.num_tensors()) encoded->digests = std::move(digests);
  encoded->owner = std::move(model);
  return encoded;
}

const std::vector<uint64_t>& TensorDigests::Of(const FlatModel& model) {
  absl::call_once(once_, [&] {
    const ModelLayout& layout = model.layout;
    digests_.reserve(layout.num_tensors());
    for (size_t t = 0; t < layout.num_tensors(); ++t) {
      digests_.push_back(DigestBytes(model.values.data() + layout.offset(t),
                                     layout.tensors()[t].NumElements() * sizeof(float)));
    }
  });
  return digests_;
}

std::shared_ptr<const EncodedModel> EncodeRaw(std::shared_ptr<const MappedModelFile> file) {
  auto encoded = std::make_shared<EncodedModel>();
  encoded->layout = file->layout();
  for (size_t t = 0; t < encoded->layout.num_tensors(); ++t) {
    encoded->encodings.emplace_back();
    encoded->payloads.push_back(file->TensorBytes(t));
  }
  encoded->owner = std::move(file);
  return encoded;
}

absl::Status CheckEncodedSize(const TensorEncoding& e, uint64_t elements, uint64_t size_bytes) {
  const uint64_t raw = elements * sizeof(float);
  switch (e.encoding) {
    case common::v1::ENCODING_RAW:
    case common::v1::ENCODING_FP16:
    case common::v1::ENCODING_INT8: {
      const uint64_t want = elements == 0 ? 0 : ValuesBytes(e.encoding, elements);
      if (size_bytes == want) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("size_bytes ", size_bytes, " does not match ", elements, " values in ",
                       common::v1::Encoding_Name(e.encoding), " (", want, " bytes)"));
    }
    case common::v1::ENCODING_SPARSE: {
      if (!IsValueEncoding(e.values_encoding)) {
        return absl::InvalidArgumentError(
            absl::StrCat("values_encoding ", common::v1::Encoding_Name(e.values_encoding),
                         " is not one of ENCODING_RAW, ENCODING_FP16, ENCODING_INT8"));
      }
      if (e.nonzeros == 0 || e.nonzeros > elements) {
        return absl::InvalidArgumentError(absl::StrCat("nonzeros ", e.nonzeros, " is not in 1..",
                                                       elements, " (the tensor's elements)"));
      }
      const uint64_t least = e.nonzeros + ValuesBytes(e.values_encoding, e.nonzeros);
      if (size_bytes < least || size_bytes > raw) {
        return absl::InvalidArgumentError(absl::StrCat("size_bytes ", size_bytes,
                                                       " of a sparse tensor with ", e.nonzeros,
                                                       " values is not in ", least, "..", raw));
      }
      return absl::OkStatus();
    }
    case common::v1::ENCODING_XOR_SPARSE_ZLIB:
      if (size_bytes == 0 || size_bytes >= raw) {
        return absl::InvalidArgumentError(
            absl::StrCat("size_bytes ", size_bytes, " of an XOR_SPARSE_ZLIB tensor is not in 1..",
                         raw == 0 ? 0 : raw - 1));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("encoding ", common::v1::Encoding_Name(e.encoding), " is not supported"));
  }
}

absl::Status DecodeTensor(const TensorEncoding& e, absl::string_view payload,
                          absl::Span<float> out) {
  SHOAL_RETURN_IF_ERROR(CheckEncodedSize(e, out.size(), payload.size()));
  if (e.encoding == common::v1::ENCODING_XOR_SPARSE_ZLIB) {
    return absl::InvalidArgumentError(
        "an XOR_SPARSE_ZLIB tensor is decoded against its base model");
  }
  if (e.encoding != common::v1::ENCODING_SPARSE) {
    if (out.empty()) return absl::OkStatus();
    return DecodeValues(e.encoding, payload, out);
  }
  const size_t k = e.nonzeros;
  std::vector<uint64_t> indices(k);
  absl::string_view in = payload;
  for (size_t j = 0; j < k; ++j) {
    uint64_t v;
    if (!ReadVarint(in, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("index #", j, ": truncated or bad varint"));
    }
    if (j > 0 && v == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("index #", j, " repeats index ", indices[j - 1]));
    }
    const uint64_t index = j == 0 ? v : indices[j - 1] + v;
    if (index >= out.size() || (j > 0 && index < indices[j - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("index #", j, " is out of range (", out.size(), " elements)"));
    }
    indices[j] = index;
  }
  if (in.size() != ValuesBytes(e.values_encoding, k)) {
    return absl::InvalidArgumentError(absl::StrCat(
        in.size(), " bytes follow the indices, but ", k, " values in ",
        common::v1::Encoding_Name(e.values_encoding), " take ", ValuesBytes(e.values_encoding, k)));
  }
  std::vector<float> values(k);
  SHOAL_RETURN_IF_ERROR(DecodeValues(e.values_encoding, in, absl::MakeSpan(values)));
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < k; ++j) out[indices[j]] = values[j];
  return absl::OkStatus();
}

absl::StatusOr<FlatModel> DecodeModel(const EncodedModel& model) {
  FlatModel decoded;
  decoded.layout = model.layout;
  decoded.values.resize(model.layout.total_elements());
  for (size_t t = 0; t < model.layout.num_tensors(); ++t) {
    absl::Span<float> out(decoded.values.data() + model.layout.offset(t),
                          model.layout.tensors()[t].NumElements());
    absl::Status s = DecodeTensor(model.encodings[t], model.payloads[t], out);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", model.layout.tensors()[t].name, "': ", s.message()));
    }
  }
  return decoded;
}

uint16_t FloatToHalf(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffff;
  if (ax > 0x7f800000) return sign | 0x7e00;   // NaN
  if (ax == 0x7f800000) return sign | 0x7c00;  // infinity
  if (ax >= 0x477fe000) return sign | 0x7bff;  // >= 65504: the largest half
  if (ax < 0x38800000) {                       // below 2^-14: a subnormal half (or zero)
    const float scaled = std::bit_cast<float>(ax) * 16777216.0f;  // x 2^24, exact
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));  // 1024 is 2^-14, also right
  }
  // Rebias the exponent (127 -> 15) and round the mantissa (23 -> 10 bits) to nearest even; a
  // carry out of the mantissa correctly bumps the exponent.
  const uint32_t rounded = ax + 0xfff + ((ax >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded >> 13) - (112 << 10));
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1f;
  const uint32_t mantissa = half & 0x3ff;
  if (exponent == 0) {
    const float v = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign != 0 ? -v : v;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::vector<uint64_t> TopKCounts(absl::Span<const uint64_t> sizes, double ratio, TopKSplit split) {
  std::vector<uint64_t> counts(sizes.size(), 0);
  std::vector<size_t> sparsified;
  uint64_t budget = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] == 0) continue;
    counts[t] =
        std::clamp<uint64_t>(static_cast<uint64_t>(std::ceil(ratio * sizes[t])), 1, sizes[t]);
    budget += counts[t];
    sparsified.push_back(t);
  }
  if (split == TopKSplit::kPerTensor) return counts;
  // Water-filling: each tensor, smallest first, takes an equal share of what is left (rounded
  // up), or all of itself when that is less. The shares never grow along the way, so the last
  // tensor's share fits it and the total stays `budget`.
  std::stable_sort(sparsified.begin(), sparsified.end(),
                   [&](size_t a, size_t b) { return sizes[a] < sizes[b]; });
  for (size_t j = 0; j < sparsified.size(); ++j) {
    const uint64_t left = sparsified.size() - j;
    const size_t t = sparsified[j];
    counts[t] = std::min<uint64_t>(sizes[t], (budget + left - 1) / left);
    budget -= counts[t];
  }
  return counts;
}

double Compressor::TopKRatio(uint64_t base_version) const {
  const uint32_t warmup = settings_.topk_warmup_rounds;
  if (base_version >= warmup) return settings_.topk_ratio;
  return std::min(1.0, std::ldexp(settings_.topk_ratio, static_cast<int>(warmup - base_version)));
}

std::shared_ptr<const EncodedModel> Compressor::Compress(std::shared_ptr<FlatModel> update,
                                                         uint64_t base_version) {
  if (settings_.codec == common::v1::ENCODING_RAW) return EncodeRaw(std::move(update));
  const ModelLayout& layout = update->layout;
  const bool topk = settings_.codec == common::v1::ENCODING_SPARSE;
  if (topk) {
    if (residual_.size() != update->values.size()) residual_.assign(update->values.size(), 0.0f);
    for (size_t i = 0; i < residual_.size(); ++i) update->values[i] += residual_[i];
  }
  auto encoded = std::make_shared<EncodedModel>();
  encoded->layout = layout;
  encoded->storage.resize(layout.num_tensors());
  encoded->encodings.resize(layout.num_tensors());
  const auto tensor = [&](size_t t) {
    return absl::Span<const float>(update->values.data() + layout.offset(t),
                                   layout.tensors()[t].NumElements());
  };
  std::vector<bool> finite(layout.num_tensors());
  std::vector<uint64_t> sparsified(layout.num_tensors(), 0);  // top-k: the sizes TopKCounts takes
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    const absl::Span<const float> d = tensor(t);
    finite[t] = std::all_of(d.begin(), d.end(), [](float v) { return std::isfinite(v); });
    if (finite[t] && !d.empty() && d.size() >= settings_.topk_min_elements) {
      sparsified[t] = d.size();
    }
  }
  const std::vector<uint64_t> kept =
      topk ? TopKCounts(sparsified, TopKRatio(base_version), settings_.topk_split)
           : std::vector<uint64_t>();
  std::vector<float> scratch;
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    const absl::Span<const float> d = tensor(t);
    TensorEncoding& e = encoded->encodings[t];
    std::string& payload = encoded->storage[t];
    if (d.empty() || !finite[t]) {
      // Raw, so that the aggregator sees (and refuses) a non-finite update as it is.
      e = TensorEncoding{};
      payload.assign(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(float));
      if (topk) std::fill_n(residual_.data() + layout.offset(t), d.size(), 0.0f);
    } else if (topk) {
      // A small tensor keeps all its values: EncodeTopK then sends it dense in topk_values.
      EncodeTopK(d, sparsified[t] == 0 ? d.size() : kept[t], settings_.topk_values, payload, e,
                 scratch);
      // Error feedback: what this tensor's encoding lost waits for the next update.
      scratch.resize(d.size());
      const absl::Status s = DecodeTensor(e, payload, absl::MakeSpan(scratch));
      float* r = residual_.data() + layout.offset(t);
      for (size_t i = 0; i < d.size(); ++i) r[i] = s.ok() ? d[i] - scratch[i] : 0.0f;
    } else {
      e = TensorEncoding{settings_.codec, common::v1::ENCODING_UNSPECIFIED, 0};
      EncodeValues(settings_.codec, d, payload);
    }
  }
  for (const std::string& p : encoded->storage) encoded->payloads.emplace_back(p);
  return encoded;
}

double Compressor::ResidualSumSquares() const {
  double total = 0;
  for (float r : residual_) total += static_cast<double>(r) * r;
  return total;
}

}  // namespace shoal::tensor
