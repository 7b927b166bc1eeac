#include "libs/tensor/xor_delta.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/parallel_for.h"
#include "libs/common/status_macros.h"

namespace shoal::tensor {
namespace {

// Values XORed, deflated or inflated at a time: 32 KiB, so a block stays in L1/L2. Each block
// names the values that changed in a bitmap, then sends their XOR byte plane by byte plane
// (ENCODING_XOR_SPARSE_ZLIB), so the place of a changed value is told once, and the
// near-constant high bytes of the changed values form long runs for deflate.
constexpr size_t kBlockValues = kXorBlockValues;
// The fastest deflate: the aggregator deflates each version before the round's first download
// of it (docs/performance.md, "Downloads against the held model"). Runs of one byte are all
// deflate is asked to find (Z_RLE): the planes' repeats are runs of zeros (values the version
// left as they were, high bytes that did not change), so a search for longer-distance matches
// costs time and, on sparse changes, bytes (its matches cover the runs less well).
constexpr int kDeflateLevel = Z_BEST_SPEED;
constexpr int kDeflateStrategy = Z_RLE;

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Values per segment of a tensor: each is deflated on its own (a raw deflate stream ended at a
// byte boundary), so the segments of a large tensor are deflated side by side and joined into
// one zlib stream, as pigz does; 64 blocks (2 MiB of values), whose fresh dictionaries cost a
// few bytes per segment.
constexpr size_t kSegmentValues = 64 * kBlockValues;

// One segment's deflated XOR planes, and the Adler-32 of the planes it took.
struct Segment {
  const float* values = nullptr;
  const float* base = nullptr;
  size_t n = 0;
  size_t block_bytes = 0;  // the uncompressed bytes of its blocks (for the Adler-32)
  bool last = false;       // of its tensor: ends the deflate stream
  std::string deflated;
  uLong adler = 0;
  bool failed = false;
};

// Deflates `seg`'s XOR planes as raw deflate data ending at a byte boundary (or the stream's end
// for the last segment). False when zlib failed or `keep_going` said no (then `*stopped`).
bool DeflateSegment(Segment& seg, const std::function<bool()>& keep_going, bool* stopped) {
  z_stream z{};
  if (deflateInit2(&z, kDeflateLevel, Z_DEFLATED, -MAX_WBITS, 8, kDeflateStrategy) != Z_OK) {
    return false;
  }
  const size_t raw = seg.n * sizeof(float) + (seg.n + kBlockValues - 1) / kBlockValues *
                                                 (kBlockValues / 8);  // values and bitmaps
  // Room for the worst case, and for the empty block a sync flush ends with.
  seg.deflated.resize(deflateBound(&z, raw) + 16);
  z.next_out = reinterpret_cast<Bytef*>(seg.deflated.data());
  z.avail_out = static_cast<uInt>(seg.deflated.size());
  seg.adler = adler32(0L, Z_NULL, 0);
  std::vector<uint32_t> bits(kBlockValues);
  std::vector<uint8_t> planes(XorBlockBound(kBlockValues));
  bool ok = true;
  for (size_t at = 0; at < seg.n && ok; at += kBlockValues) {
    if (keep_going && !keep_going()) {
      *stopped = true;
      ok = false;
      break;
    }
    const size_t n = std::min(kBlockValues, seg.n - at);
    for (size_t i = 0; i < n; ++i) bits[i] = Bits(seg.values[at + i]) ^ Bits(seg.base[at + i]);
    const uInt len =
        static_cast<uInt>(WriteXorBlock(absl::MakeConstSpan(bits.data(), n), planes.data()));
    seg.block_bytes += len;
    seg.adler = adler32(seg.adler, planes.data(), len);
    z.next_in = planes.data();
    z.avail_in = len;
    const bool end = at + n == seg.n;
    const int flush = !end ? Z_NO_FLUSH : seg.last ? Z_FINISH : Z_SYNC_FLUSH;
    const int rc = deflate(&z, flush);
    ok = z.avail_in == 0 && (end && seg.last ? rc == Z_STREAM_END : rc == Z_OK);
  }
  const size_t size = seg.deflated.size() - z.avail_out;
  deflateEnd(&z);
  if (!ok) {
    seg.deflated.clear();
    seg.deflated.shrink_to_fit();
    return false;
  }
  seg.deflated.resize(size);
  seg.deflated.shrink_to_fit();
  return true;
}

}  // namespace

size_t WriteXorBlock(absl::Span<const uint32_t> x, uint8_t* out) {
  const size_t n = x.size();
  const size_t bitmap = (n + 7) / 8;
  std::memset(out, 0, bitmap);
  size_t changed = 0;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] == 0) continue;
    out[i / 8] = static_cast<uint8_t>(out[i / 8] | (1u << (i % 8)));
    ++changed;
  }
  uint8_t* planes = out + bitmap;
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] == 0) continue;
    planes[j] = static_cast<uint8_t>(x[i]);
    planes[changed + j] = static_cast<uint8_t>(x[i] >> 8);
    planes[2 * changed + j] = static_cast<uint8_t>(x[i] >> 16);
    planes[3 * changed + j] = static_cast<uint8_t>(x[i] >> 24);
    ++j;
  }
  return bitmap + 4 * changed;
}

absl::StatusOr<std::shared_ptr<const EncodedModel>> EncodeXorDelta(
    std::shared_ptr<const FlatModel> model, const FlatModel& base,
    const std::function<bool()>& keep_going, int threads) {
  if (model->layout != base.layout) {
    return absl::InvalidArgumentError("the base model's layout differs from the model's");
  }
  const ModelLayout& layout = model->layout;
  // Every tensor's segments, in order.
  std::vector<Segment> segments;
  std::vector<size_t> first(layout.num_tensors() + 1, 0);
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    first[t] = segments.size();
    const size_t n = static_cast<size_t>(layout.tensors()[t].NumElements());
    for (size_t at = 0; at < n; at += kSegmentValues) {
      Segment seg;
      seg.values = model->values.data() + layout.offset(t) + at;
      seg.base = base.values.data() + layout.offset(t) + at;
      seg.n = std::min(kSegmentValues, n - at);
      seg.last = at + seg.n == n;
      segments.push_back(std::move(seg));
    }
  }
  first[layout.num_tensors()] = segments.size();
  std::atomic<bool> stopped{false};
  common::ParallelFor(
      segments.size(), threads,
      [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end && !stopped.load(std::memory_order_relaxed); ++i) {
          bool stop = false;
          if (!DeflateSegment(segments[i], keep_going, &stop)) segments[i].failed = true;
          if (stop) stopped = true;
        }
      },
      /*min_per_thread=*/1);
  if (stopped) return absl::CancelledError("the encoding was stopped");

  auto encoded = std::make_shared<EncodedModel>();
  encoded->layout = layout;
  encoded->storage.resize(layout.num_tensors());
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    const size_t n = static_cast<size_t>(layout.tensors()[t].NumElements());
    const auto* values = model->values.data() + layout.offset(t);
    const absl::string_view raw(reinterpret_cast<const char*>(values), n * sizeof(float));
    // One zlib stream: its header, the segments' deflate data, the Adler-32 of all the planes.
    size_t size = 2 + 4;
    bool whole = n > 0;
    for (size_t i = first[t]; i < first[t + 1]; ++i) {
      whole = whole && !segments[i].failed;
      size += segments[i].deflated.size();
    }
    TensorEncoding e;
    if (whole && size < raw.size()) {
      std::string& deflated = encoded->storage[t];
      deflated.reserve(size);
      deflated.push_back(static_cast<char>(0x78));  // deflate, 32 KiB window
      deflated.push_back(static_cast<char>(0x01));  // the fastest level, no dictionary
      uLong adler = adler32(0L, Z_NULL, 0);
      for (size_t i = first[t]; i < first[t + 1]; ++i) {
        Segment& seg = segments[i];
        deflated += seg.deflated;
        adler = adler32_combine(adler, seg.adler, static_cast<z_off_t>(seg.block_bytes));
        std::string().swap(seg.deflated);
      }
      for (int shift = 24; shift >= 0; shift -= 8) {
        deflated.push_back(static_cast<char>((adler >> shift) & 0xff));
      }
      e.encoding = common::v1::ENCODING_XOR_SPARSE_ZLIB;
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
    : stream_(std::make_unique<z_stream_s>()),
      out_(XorBlockBound(kBlockValues)),
      held_(kBlockValues) {}

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
    changed_ = other.changed_;
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
  changed_ = -1;
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
            "XOR_SPARSE_ZLIB data inflates to more than the tensor's ", bytes_total_, " bytes"));
      }
      if (rc != Z_OK) return Corrupt(z);
      continue;
    }
    // One block at a time: its bitmap, then the byte planes of the values it names, put back
    // together once all of them are in.
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlockValues, remaining / 4));
    const size_t bitmap = (n + 7) / 8;
    const size_t block = changed_ < 0 ? bitmap : bitmap + 4 * static_cast<size_t>(changed_);
    z.next_out = out_.data() + out_bytes_;
    z.avail_out = static_cast<uInt>(block - out_bytes_);
    const uInt before = z.avail_out;
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) return Corrupt(z);
    out_bytes_ += before - z.avail_out;
    if (rc == Z_STREAM_END) ended_ = true;
    if (out_bytes_ < block) continue;
    if (changed_ < 0) SHOAL_RETURN_IF_ERROR(CountChanged(n));
    if (out_bytes_ == bitmap + 4 * static_cast<size_t>(changed_)) {
      SHOAL_RETURN_IF_ERROR(Drain(n, emit));
    }
  }
  return absl::OkStatus();
}

absl::Status XorInflater::CountChanged(size_t n) {
  int changed = 0;
  for (size_t i = 0; i < (n + 7) / 8; ++i) changed += __builtin_popcount(out_[i]);
  if (n % 8 != 0 && (out_[n / 8] >> (n % 8)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "XOR_SPARSE_ZLIB data is corrupt: a block's bitmap names values past its ", n));
  }
  changed_ = changed;
  return absl::OkStatus();
}

absl::Status XorInflater::Corrupt(const z_stream_s& z) {
  return absl::InvalidArgumentError(
      absl::StrCat("XOR_SPARSE_ZLIB data is corrupt: ", z.msg != nullptr ? z.msg : "zlib error"));
}

absl::Status XorInflater::Drain(size_t n, const Emit& emit) {
  const size_t first = offset_ + bytes_emitted_ / sizeof(float);
  SHOAL_RETURN_IF_ERROR(base_(first, absl::MakeSpan(held_.data(), n)));
  const uint8_t* bitmap = out_.data();
  const size_t changed = static_cast<size_t>(changed_);
  const uint8_t* planes = bitmap + (n + 7) / 8;
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    if ((bitmap[i / 8] >> (i % 8) & 1) == 0) continue;
    const uint32_t x = uint32_t{planes[j]} | uint32_t{planes[changed + j]} << 8 |
                       uint32_t{planes[2 * changed + j]} << 16 |
                       uint32_t{planes[3 * changed + j]} << 24;
    const uint32_t bits = x ^ Bits(held_[i]);
    std::memcpy(&held_[i], &bits, sizeof bits);
    ++j;
  }
  const size_t bytes = n * sizeof(float);
  SHOAL_RETURN_IF_ERROR(
      emit(absl::string_view(reinterpret_cast<const char*>(held_.data()), bytes)));
  bytes_emitted_ += bytes;
  out_bytes_ = 0;
  changed_ = -1;
  return absl::OkStatus();
}

absl::Status XorInflater::Finish() const {
  if (!ended_ || bytes_emitted_ != bytes_total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "XOR_SPARSE_ZLIB data is truncated: the zlib stream ", ended_ ? "ended" : "did not end",
        " after ", bytes_emitted_, " of the tensor's ", bytes_total_, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace shoal::tensor
