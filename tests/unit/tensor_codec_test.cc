#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"

namespace shoal::tensor {
namespace {

using common::v1::TensorFrame;
using ::testing::HasSubstr;

FlatModel MakeModel(std::vector<TensorSpec> specs, float start = 0.5f) {
  FlatModel m;
  m.layout = *ModelLayout::Create(std::move(specs));
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = start + 0.25f * static_cast<float>(i);
  return m;
}

FlatModel SmallModel() {
  return MakeModel({{"conv.weight", {4, 1, 3, 3}},
                    {"conv.bias", {4}},
                    {"empty", {0, 3}},
                    {"fc.weight", {10, 36}}});
}

std::vector<TensorFrame> Encode(const FlatModel& m, size_t chunk = kDefaultChunkBytes) {
  std::vector<TensorFrame> frames;
  FrameEncoder enc(m, chunk);
  TensorFrame f;
  while (enc.Next(&f)) frames.push_back(f);
  return frames;
}

absl::StatusOr<FlatModel> DecodeLayout(const ModelLayout& layout,
                                       const std::vector<TensorFrame>& frames, bool finite = true) {
  FrameDecoder d = FrameDecoder::ForLayout(layout, finite);
  for (const auto& f : frames) {
    absl::Status s = d.Add(f);
    if (!s.ok()) return s;
  }
  return std::move(d).Finish();
}

TEST(ModelLayoutTest, OffsetsAndErrors) {
  auto layout = ModelLayout::Create({{"a", {2, 3}}, {"b", {4}}});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->offset(0), 0u);
  EXPECT_EQ(layout->offset(1), 6u);
  EXPECT_EQ(layout->total_elements(), 10u);
  EXPECT_EQ(layout->total_bytes(), 40u);
  EXPECT_EQ(layout->DebugString(), "a[2,3], b[4]");
  EXPECT_EQ(ModelLayout::Create({{"a", {1}}, {"a", {2}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"", {1}}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"a", {-1}}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FrameCodecTest, RoundTripWithSmallChunks) {
  FlatModel m = SmallModel();
  // 7-byte chunks split floats across chunk boundaries.
  auto frames = Encode(m, 7);
  EXPECT_GT(frames.size(), 100u);
  auto got = DecodeLayout(m.layout, frames);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layout, m.layout);
  EXPECT_EQ(got->values, m.values);
  EXPECT_EQ(got->Digest(), m.Digest());
}

TEST(FrameCodecTest, RoundTripForMeta) {
  FlatModel m = SmallModel();
  auto meta = MakeModelMeta("t", 3, m);
  EXPECT_EQ(meta.num_tensors(), 4u);
  EXPECT_EQ(meta.total_bytes(), m.layout.total_bytes());
  auto d = FrameDecoder::ForMeta(meta, {}, true);
  ASSERT_TRUE(d.ok());
  for (const auto& f : Encode(m)) ASSERT_TRUE(d->Add(f).ok());
  EXPECT_EQ(d->bytes_received(), m.layout.total_bytes());
  auto got = std::move(*d).Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layout, m.layout);
  EXPECT_EQ(got->values, m.values);
}

// A decoder that hands its values on (ForMeta with a WriteValues) into `out`, sized by the meta.
absl::StatusOr<ModelLayout> DecodeInto(const FlatModel& m, const std::vector<TensorFrame>& frames,
                                       std::vector<float>& out, size_t* largest_write = nullptr) {
  out.assign(m.layout.total_elements(), -1.0f);
  auto d = FrameDecoder::ForMeta(MakeModelMeta("t", 1, m), {}, /*require_finite=*/true,
                                 [&](size_t first, absl::Span<const float> values) {
                                   EXPECT_LE(first + values.size(), out.size());
                                   std::copy(values.begin(), values.end(), out.begin() + first);
                                   if (largest_write != nullptr) {
                                     *largest_write = std::max(*largest_write, values.size());
                                   }
                                   return absl::OkStatus();
                                 });
  if (!d.ok()) return d.status();
  for (const auto& f : frames) {
    if (absl::Status s = d->Add(f); !s.ok()) return s;
  }
  auto got = std::move(*d).Finish();
  if (!got.ok()) return got.status();
  EXPECT_TRUE(got->values.empty());  // nothing kept
  return got->layout;
}

TEST(FrameCodecTest, StreamingDecoderHandsOnEveryValueInBlocks) {
  // 7-byte chunks split floats across chunk boundaries: a split value is written once whole.
  FlatModel m = SmallModel();
  std::vector<float> out;
  auto layout = DecodeInto(m, Encode(m, 7), out);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(*layout, m.layout);
  EXPECT_EQ(out, m.values);

  // 1 MiB chunks of a 3 MiB tensor go on in 32 KiB blocks: the decoder holds no more.
  FlatModel big = MakeModel({{"big", {3 << 18}}});
  size_t largest = 0;
  ASSERT_TRUE(DecodeInto(big, Encode(big), out, &largest).ok());
  EXPECT_EQ(out, big.values);
  EXPECT_EQ(largest, (32u << 10) / sizeof(float));
}

TEST(FrameCodecTest, StreamingDecoderFailsOnABadDigestAndOnAFailedWrite) {
  FlatModel m = SmallModel();
  auto frames = Encode(m);
  frames[0].mutable_header()->set_digest_xxh3(frames[0].header().digest_xxh3() ^ 1);
  std::vector<float> out;
  auto bad = DecodeInto(m, frames, out);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("digest mismatch"));

  // The writer's error ends the stream; later calls return it too.
  auto d = FrameDecoder::ForMeta(
      MakeModelMeta("t", 1, m), {}, false,
      [](size_t, absl::Span<const float>) { return absl::ResourceExhaustedError("disk full"); });
  ASSERT_TRUE(d.ok());
  absl::Status s;
  for (const auto& f : Encode(m)) {
    s = d->Add(f);
    if (!s.ok()) break;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::move(*d).Finish().status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(FrameCodecTest, ChunkSizesAreBounded) {
  FlatModel m = MakeModel({{"big", {3 << 18}}});  // 3 MiB
  auto frames = Encode(m);
  ASSERT_EQ(frames.size(), 4u);  // header + 3 x 1 MiB
  for (size_t i = 1; i < frames.size(); ++i) EXPECT_EQ(frames[i].chunk().size(), 1u << 20);
}

TEST(FrameCodecTest, SumSquaresIsTheSquaredNorm) {
  FlatModel m = SmallModel();
  double want = 0;
  for (float v : m.values) want += static_cast<double>(v) * v;
  FrameDecoder d = FrameDecoder::ForLayout(m.layout, true);
  for (const auto& f : Encode(m, 100)) ASSERT_TRUE(d.Add(f).ok());
  EXPECT_NEAR(d.sum_squares(), want, want * 1e-5);
}

TEST(FrameCodecTest, CorruptDigestIsRejected) {
  FlatModel m = SmallModel();
  auto frames = Encode(m);
  // Flip one byte of fc.weight's payload.
  TensorFrame& last = frames.back();
  ASSERT_TRUE(last.has_chunk());
  (*last.mutable_chunk())[5] ^= 0x40;
  auto got = DecodeLayout(m.layout, frames, false);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("fc.weight"));
  EXPECT_THAT(got.status().message(), HasSubstr("digest"));
}

TEST(FrameCodecTest, WrongShapeIsRejectedNamingTheTensor) {
  FlatModel m = SmallModel();
  FlatModel other = MakeModel({{"conv.weight", {4, 1, 3, 3}},
                               {"conv.bias", {5}},
                               {"empty", {0, 3}},
                               {"fc.weight", {10, 36}}});
  auto got = DecodeLayout(m.layout, Encode(other));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("conv.bias"));
  EXPECT_THAT(got.status().message(), HasSubstr("shape"));
}

TEST(FrameCodecTest, WrongNameOrderAndCountAreRejected) {
  FlatModel m = SmallModel();
  FlatModel renamed = MakeModel(
      {{"conv.weight", {4, 1, 3, 3}}, {"conv.b", {4}}, {"empty", {0, 3}}, {"fc.weight", {10, 36}}});
  EXPECT_THAT(DecodeLayout(m.layout, Encode(renamed)).status().message(), HasSubstr("conv.b"));
  FlatModel extra = MakeModel({{"conv.weight", {4, 1, 3, 3}},
                               {"conv.bias", {4}},
                               {"empty", {0, 3}},
                               {"fc.weight", {10, 36}},
                               {"x", {1}}});
  EXPECT_THAT(DecodeLayout(m.layout, Encode(extra)).status().message(), HasSubstr("extra"));
  FlatModel fewer = MakeModel({{"conv.weight", {4, 1, 3, 3}}, {"conv.bias", {4}}});
  auto got = DecodeLayout(m.layout, Encode(fewer));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("missing 'empty'"));
}

TEST(FrameCodecTest, WrongDtypeEncodingAndSizeAreRejected) {
  FlatModel m = SmallModel();
  auto frames = Encode(m);
  auto dtype = frames;
  dtype[0].mutable_header()->set_dtype(common::v1::DTYPE_UNSPECIFIED);
  auto s = DecodeLayout(m.layout, dtype).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("conv.weight"));
  EXPECT_THAT(s.message(), HasSubstr("dtype"));

  auto enc = frames;
  enc[0].mutable_header()->set_encoding(common::v1::ENCODING_UNSPECIFIED);
  EXPECT_THAT(DecodeLayout(m.layout, enc).status().message(), HasSubstr("encoding"));

  auto size = frames;
  size[0].mutable_header()->set_size_bytes(12);
  EXPECT_THAT(DecodeLayout(m.layout, size).status().message(), HasSubstr("size_bytes"));
}

TEST(FrameCodecTest, NonFiniteValuesAreRejectedWhenRequired) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    FlatModel m = SmallModel();
    m.values[m.layout.offset(3) + 17] = bad;
    auto got = DecodeLayout(m.layout, Encode(m, 64), /*finite=*/true);
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr("fc.weight"));
    EXPECT_THAT(got.status().message(), HasSubstr("element 17"));
    // Without the check the value goes through unchanged.
    auto lenient = DecodeLayout(m.layout, Encode(m, 64), /*finite=*/false);
    ASSERT_TRUE(lenient.ok());
  }
}

TEST(FrameCodecTest, RingValuesTravelBitForBitWhereAMaskedUpdateIsExpected) {
  // Masked updates are uint32 values of Z_(2^32): as float32 bits some are NaN, infinite or
  // subnormal, and all must arrive as they were, through the finite check.
  FlatModel m = MakeModel({{"w", {2}}, TensorSpec{"masked_update", {6}, Element::kUint32}});
  const std::vector<uint32_t> ring = {0x7fc00001u, 0xffffffffu, 0x7f800000u, 1u, 0u, 0xff800000u};
  std::memcpy(m.values.data() + 2, ring.data(), ring.size() * sizeof(uint32_t));
  EXPECT_EQ(m.layout.DebugString(), "w[2], masked_update[6] uint32");
  auto frames = Encode(m, 5);
  std::vector<common::v1::DType> dtypes;
  for (const TensorFrame& f : frames) {
    if (f.has_header()) dtypes.push_back(f.header().dtype());
  }
  EXPECT_EQ(dtypes,
            (std::vector<common::v1::DType>{common::v1::DTYPE_FLOAT32, common::v1::DTYPE_UINT32}));
  auto got = DecodeLayout(m.layout, frames, /*finite=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<uint32_t> back(ring.size());
  std::memcpy(back.data(), got->values.data() + 2, back.size() * sizeof(uint32_t));
  EXPECT_EQ(back, ring);
  EXPECT_EQ(got->Digest(), m.Digest());

  // Where float32 is expected, the same stream is refused, and the other way round.
  const ModelLayout floats = *ModelLayout::Create({{"w", {2}}, {"masked_update", {6}}});
  EXPECT_THAT(DecodeLayout(floats, frames).status().message(),
              HasSubstr("dtype DTYPE_UINT32 but a float32 tensor was expected"));
  FlatModel as_floats = MakeModel({{"w", {2}}, {"masked_update", {6}}});
  EXPECT_THAT(DecodeLayout(m.layout, Encode(as_floats)).status().message(),
              HasSubstr("masked update (DTYPE_UINT32)"));
  // Only raw, and never in a model whose layout comes from the stream.
  auto packed = frames;
  for (TensorFrame& f : packed) {
    if (f.has_header() && f.header().name() == "masked_update") {
      f.mutable_header()->set_encoding(common::v1::ENCODING_FP16);
    }
  }
  EXPECT_THAT(DecodeLayout(m.layout, packed).status().message(),
              HasSubstr("DTYPE_UINT32 must be ENCODING_RAW"));
  auto meta = MakeModelMeta("t", 1, m);
  absl::StatusOr<FrameDecoder> d = FrameDecoder::ForMeta(meta, {}, /*require_finite=*/false);
  ASSERT_TRUE(d.ok());
  absl::Status s;
  for (const TensorFrame& f : frames) {
    s = d->Add(f);
    if (!s.ok()) break;
  }
  EXPECT_THAT(s.message(), HasSubstr("DTYPE_UINT32 where a model of float32 was expected"));
}

TEST(FrameCodecTest, HugeFiniteValuesAreNotMistakenForInfinity) {
  FlatModel m = MakeModel({{"w", {40}}});
  for (float& v : m.values) v = 3e38f;  // squares overflow float
  auto got = DecodeLayout(m.layout, Encode(m));
  ASSERT_TRUE(got.ok()) << got.status();
}

TEST(FrameCodecTest, TruncatedStreamIsRejected) {
  FlatModel m = SmallModel();
  auto frames = Encode(m, 64);
  frames.pop_back();
  auto got = DecodeLayout(m.layout, frames);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("fc.weight"));
  EXPECT_THAT(got.status().message(), HasSubstr("ended inside"));
}

TEST(FrameCodecTest, OversizeAndOverrunningChunksAreRejected) {
  FlatModel m = MakeModel({{"w", {3 << 20}}});  // 12 MiB
  auto frames = Encode(m);
  TensorFrame big;
  big.set_chunk(std::string(kMaxChunkBytes + 1, 'x'));
  FrameDecoder d = FrameDecoder::ForLayout(m.layout, false);
  ASSERT_TRUE(d.Add(frames[0]).ok());
  absl::Status s = d.Add(big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exceeds the limit"));
  // The decoder stays failed.
  EXPECT_EQ(d.Add(frames[1]).code(), absl::StatusCode::kInvalidArgument);

  FlatModel small = MakeModel({{"w", {4}}});
  auto sf = Encode(small);
  TensorFrame over;
  over.set_chunk(std::string(20, 'x'));
  FrameDecoder d2 = FrameDecoder::ForLayout(small.layout, false);
  ASSERT_TRUE(d2.Add(sf[0]).ok());
  EXPECT_THAT(d2.Add(over).message(), HasSubstr("exceed size_bytes"));
}

TEST(FrameCodecTest, OutOfOrderFramesAreRejected) {
  FlatModel m = SmallModel();
  auto frames = Encode(m);
  FrameDecoder d = FrameDecoder::ForLayout(m.layout, false);
  EXPECT_THAT(d.Add(frames[1]).message(), HasSubstr("before any tensor header"));
  FrameDecoder d2 = FrameDecoder::ForLayout(m.layout, false);
  ASSERT_TRUE(d2.Add(frames[0]).ok());
  EXPECT_THAT(d2.Add(frames[2]).message(), HasSubstr("incomplete"));
  FrameDecoder d3 = FrameDecoder::ForLayout(m.layout, false);
  EXPECT_THAT(d3.Add(TensorFrame()).message(), HasSubstr("empty TensorFrame"));
}

TEST(FrameCodecTest, MetaLimitsAreEnforced) {
  FlatModel m = SmallModel();
  auto meta = MakeModelMeta("t", 0, m);
  DecoderLimits limits;
  limits.max_tensors = 2;
  EXPECT_EQ(FrameDecoder::ForMeta(meta, limits, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  limits = {};
  limits.max_total_bytes = 100;
  EXPECT_EQ(FrameDecoder::ForMeta(meta, limits, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A stream carrying more bytes than its meta announced.
  auto small_meta = meta;
  small_meta.set_total_bytes(64);
  auto d = FrameDecoder::ForMeta(small_meta, {}, false);
  ASSERT_TRUE(d.ok());
  absl::Status s;
  for (const auto& f : Encode(m)) {
    s = d->Add(f);
    if (!s.ok()) break;
  }
  EXPECT_THAT(s.message(), HasSubstr("exceeds ModelMeta total_bytes"));
  // Fewer tensors than announced.
  auto more_meta = meta;
  more_meta.set_num_tensors(5);
  auto d2 = FrameDecoder::ForMeta(more_meta, {}, false);
  for (const auto& f : Encode(m)) ASSERT_TRUE(d2->Add(f).ok());
  EXPECT_THAT(std::move(*d2).Finish().status().message(), HasSubstr("4 of 5"));
}

TEST(FrameCodecTest, DecoderReusesAPooledBuffer) {
  FlatModel m = SmallModel();
  std::vector<float> buffer(m.layout.total_elements(), -1.0f);
  const float* data = buffer.data();
  FrameDecoder d = FrameDecoder::ForLayout(m.layout, true, std::move(buffer));
  for (const auto& f : Encode(m)) ASSERT_TRUE(d.Add(f).ok());
  auto got = std::move(d).Finish();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->values.data(), data);
  EXPECT_EQ(got->values, m.values);
}

// The same when the layout comes with the stream (ForMeta: a cluster aggregator's download of
// its parent's version), a buffer that held more values before included.
TEST(FrameCodecTest, ADecoderForAStreamsMetaReusesAPooledBuffer) {
  FlatModel m = SmallModel();
  const auto meta = MakeModelMeta("t", 0, m);
  std::vector<float> buffer(m.layout.total_elements() + 7, -1.0f);
  const float* data = buffer.data();
  absl::StatusOr<FrameDecoder> d =
      FrameDecoder::ForMeta(meta, {}, true, nullptr, nullptr, std::move(buffer));
  ASSERT_TRUE(d.ok()) << d.status();
  for (const auto& f : Encode(m)) ASSERT_TRUE(d->Add(f).ok());
  auto got = std::move(*d).Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->values.data(), data);
  EXPECT_EQ(got->values, m.values);
}

}  // namespace
}  // namespace shoal::tensor
