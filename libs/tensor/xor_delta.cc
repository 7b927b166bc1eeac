#include "libs/tensor/xor_delta.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace shoal::tensor {
namespace {

// Values XORed, deflated or inflated at a time: 32 KiB, so a block stays in L1/L2. Each block's
// XOR goes byte plane by byte plane (ENCODING_XOR_ZLIB), so the near-constant high bytes of all
// its values form long runs for deflate.
constexpr size_t kBlockValues = kXorBlockValues;
// The fastest deflate: the aggregator deflates each version before the round's first download
// of it (docs/performance.md, "Downloads against the held model").
constexpr int kDeflateLevel = Z_BEST_SPEED;

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Deflates the XOR of `values` with `base` into `out`. False when the result would not be
// smaller than the raw bytes (then `out` is cleared) or `keep_going` said no (then `*stopped`).
bool DeflateXor(absl::Span<const float> values, absl::Span<const float> base,
                const std::function<bool()>& keep_going, std::string* out, bool* stopped) {
  const size_t raw = values.size() * sizeof(float);
  if (raw < 2) return false;
  z_stream z{};
  if (deflateInit(&z, kDeflateLevel) != Z_OK) return false;
  out->resize(raw - 1);  // one byte short of raw: what does not fit is not worth sending
  z.next_out = reinterpret_cast<Bytef*>(out->data());
  z.avail_out = static_cast<uInt>(out->size());
  std::vector<uint8_t> planes(kBlockValues * sizeof(uint32_t));
  int rc = Z_OK;
  for (size_t at = 0; at < values.size() && rc == Z_OK; at += kBlockValues) {
    if (keep_going && !keep_going()) {
      *stopped = true;
      break;
    }
    const size_t n = std::min(kBlockValues, values.size() - at);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t x = Bits(values[at + i]) ^ Bits(base[at + i]);
      planes[i] = static_cast<uint8_t>(x);
      planes[n + i] = static_cast<uint8_t>(x >> 8);
      planes[2 * n + i] = static_cast<uint8_t>(x >> 16);
      planes[3 * n + i] = static_cast<uint8_t>(x >> 24);
    }
    z.next_in = planes.data();
    z.avail_in = static_cast<uInt>(n * sizeof(uint32_t));
    const bool last = at + n == values.size();
    rc = deflate(&z, last ? Z_FINISH : Z_NO_FLUSH);
    if (!last && (rc == Z_OK || rc == Z_BUF_ERROR) && z.avail_out == 0) rc = Z_BUF_ERROR;
    if (!last && rc == Z_OK && z.avail_in != 0) rc = Z_BUF_ERROR;
  }
  const bool fits = rc == Z_STREAM_END;
  const size_t size = out->size() - z.avail_out;
  deflateEnd(&z);
  if (!fits) {
    out->clear();
    out->shrink_to_fit();
    return false;
  }
  out->resize(size);
  out->shrink_to_fit();
  return true;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const EncodedModel>> EncodeXorDelta(
    std::shared_ptr<const FlatModel> model, const FlatModel& base,
    const std::function<bool()>& keep_going) {
  if (model->layout != base.layout) {
    return absl::InvalidArgumentError("the base model's layout differs from the model's");
  }
  auto encoded = std::make_shared<EncodedModel>();
  const ModelLayout& layout = model->layout;
  encoded->layout = layout;
  encoded->storage.resize(layout.num_tensors());
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    const size_t n = static_cast<size_t>(layout.tensors()[t].NumElements());
    const auto values = absl::MakeConstSpan(model->values.data() + layout.offset(t), n);
    const auto held = absl::MakeConstSpan(base.values.data() + layout.offset(t), n);
    const absl::string_view raw(reinterpret_cast<const char*>(values.data()), n * sizeof(float));
    std::string& deflated = encoded->storage[t];
    TensorEncoding e;
    bool stopped = false;
    const bool smaller = DeflateXor(values, held, keep_going, &deflated, &stopped);
    if (stopped) return absl::CancelledError("the encoding was stopped");
    if (smaller) {
      e.encoding = common::v1::ENCODING_XOR_ZLIB;
      encoded->payloads.emplace_back(deflated);
    } else {
      encoded->payloads.push_back(raw);
    }
    encoded->encodings.push_back(e);
    encoded->digests.push_back(DigestBytes(raw.data(), raw.size()));
  }
  encoded->owner = std::move(model);
  return std::shared_ptr<const EncodedModel>(std::move(encoded));
}

XorInflater::XorInflater()
    : stream_(std::make_unique<z_stream_s>()), out_(kBlockValues), held_(kBlockValues) {}

XorInflater::~XorInflater() {
  if (stream_ && started_) inflateEnd(stream_.get());
}

XorInflater::XorInflater(XorInflater&&) noexcept = default;
XorInflater& XorInflater::operator=(XorInflater&& other) noexcept {
  if (this != &other) {
    if (stream_ && started_) inflateEnd(stream_.get());
    stream_ = std::move(other.stream_);
    started_ = std::exchange(other.started_, false);
    ended_ = other.ended_;
    base_ = std::move(other.base_);
    offset_ = other.offset_;
    bytes_total_ = other.bytes_total_;
    bytes_emitted_ = other.bytes_emitted_;
    out_ = std::move(other.out_);
    held_ = std::move(other.held_);
    out_bytes_ = other.out_bytes_;
  }
  return *this;
}

absl::Status XorInflater::Start(ReadValues base, size_t offset, uint64_t elements) {
  if (started_) {
    inflateEnd(stream_.get());
    started_ = false;
  }
  *stream_ = z_stream_s{};
  if (inflateInit(stream_.get()) != Z_OK) {
    return absl::ResourceExhaustedError("cannot start zlib inflate");
  }
  started_ = true;
  ended_ = false;
  base_ = std::move(base);
  offset_ = offset;
  bytes_total_ = elements * sizeof(float);
  bytes_emitted_ = 0;
  out_bytes_ = 0;
  return absl::OkStatus();
}

absl::Status XorInflater::Feed(absl::string_view compressed, const Emit& emit) {
  if (!started_) return absl::FailedPreconditionError("XorInflater::Feed before Start");
  z_stream_s& z = *stream_;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  z.avail_in = static_cast<uInt>(compressed.size());
  while (z.avail_in > 0) {
    if (ended_) {
      return absl::InvalidArgumentError(
          absl::StrCat(z.avail_in, " bytes follow the end of the zlib stream"));
    }
    const uint64_t remaining = bytes_total_ - bytes_emitted_;
    if (remaining == 0) {
      // Nothing more may come out; a byte that inflates to more is an error, the stream's
      // trailer is not.
      uint8_t probe;
      z.next_out = &probe;
      z.avail_out = 1;
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc == Z_STREAM_END && z.avail_out == 1) {
        ended_ = true;
        continue;
      }
      if (z.avail_out == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "XOR_ZLIB data inflates to more than the tensor's ", bytes_total_, " bytes"));
      }
      if (rc != Z_OK) return Corrupt(z);
      continue;
    }
    // One block at a time: its byte planes are put back together once all of them are in.
    const size_t block = static_cast<size_t>(std::min<uint64_t>(kBlockValues * 4, remaining));
    z.next_out = reinterpret_cast<Bytef*>(out_.data()) + out_bytes_;
    z.avail_out = static_cast<uInt>(block - out_bytes_);
    const uInt before = z.avail_out;
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) return Corrupt(z);
    out_bytes_ += before - z.avail_out;
    if (rc == Z_STREAM_END) ended_ = true;
    if (out_bytes_ == block) SHOAL_RETURN_IF_ERROR(Drain(emit));
  }
  return absl::OkStatus();
}

absl::Status XorInflater::Corrupt(const z_stream_s& z) {
  return absl::InvalidArgumentError(
      absl::StrCat("XOR_ZLIB data is corrupt: ", z.msg != nullptr ? z.msg : "zlib error"));
}

absl::Status XorInflater::Drain(const Emit& emit) {
  const size_t n = out_bytes_ / sizeof(float);
  const size_t first = offset_ + bytes_emitted_ / sizeof(float);
  SHOAL_RETURN_IF_ERROR(base_(first, absl::MakeSpan(held_.data(), n)));
  const auto* planes = reinterpret_cast<const uint8_t*>(out_.data());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = uint32_t{planes[i]} | uint32_t{planes[n + i]} << 8 |
                       uint32_t{planes[2 * n + i]} << 16 | uint32_t{planes[3 * n + i]} << 24;
    const uint32_t bits = x ^ Bits(held_[i]);
    std::memcpy(&held_[i], &bits, sizeof bits);
  }
  const size_t bytes = n * sizeof(float);
  SHOAL_RETURN_IF_ERROR(
      emit(absl::string_view(reinterpret_cast<const char*>(held_.data()), bytes)));
  bytes_emitted_ += bytes;
  out_bytes_ = 0;
  return absl::OkStatus();
}

absl::Status XorInflater::Finish() const {
  if (!ended_ || bytes_emitted_ != bytes_total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "XOR_ZLIB data is truncated: the zlib stream ", ended_ ? "ended" : "did not end", " after ",
        bytes_emitted_ + out_bytes_, " of the tensor's ", bytes_total_, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace shoal::tensor
