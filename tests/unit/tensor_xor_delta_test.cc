// Downloads against a held version (ENCODING_XOR_SPARSE_ZLIB): EncodeXorDelta on the aggregator's
// side, FrameDecoder::ForMeta with the held base on the peer's, and every way the compressed data
// can be wrong.
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/status_macros.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/xor_delta.h"

namespace shoal::tensor {
namespace {

using common::v1::ENCODING_RAW;
using common::v1::ENCODING_XOR_SPARSE_ZLIB;
using common::v1::ModelMeta;
using common::v1::TensorFrame;
using ::testing::HasSubstr;

std::shared_ptr<FlatModel> RandomModel(std::vector<TensorSpec> specs, uint32_t seed) {
  auto m = std::make_shared<FlatModel>();
  m->layout = *ModelLayout::Create(std::move(specs));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  m->values.resize(m->layout.total_elements());
  for (float& v : m->values) v = normal(gen);
  return m;
}

std::vector<TensorSpec> Specs() {
  return {{"conv.weight", {8, 1, 5, 5}}, {"one", {1}}, {"empty", {0}}, {"fc.weight", {10, 4000}}};
}

// `base` after one small training step: every value moves a little.
std::shared_ptr<FlatModel> NextVersion(const FlatModel& base, uint32_t seed) {
  auto next = std::make_shared<FlatModel>(base);
  std::mt19937 gen(seed);
  std::normal_distribution<float> step(0.0f, 1e-4f);
  for (float& v : next->values) v += step(gen);
  return next;
}

ReadValues ReaderOf(const FlatModel& base) {
  return [&base](size_t first, absl::Span<float> out) {
    if (first + out.size() > base.values.size()) return absl::OutOfRangeError("past the base");
    std::memcpy(out.data(), base.values.data() + first, out.size() * sizeof(float));
    return absl::OkStatus();
  };
}

ModelMeta MetaOf(const ModelLayout& layout, uint64_t base_version) {
  ModelMeta meta = MakeModelMeta("t", base_version + 1, layout);
  meta.set_xor_base_version(base_version);
  return meta;
}

// Streams `model` through FrameEncoder and a ForMeta decoder holding `base` (what a peer runs),
// handing the values to `write` as they arrive when given.
absl::StatusOr<FlatModel> Download(const EncodedModel& model, const ModelMeta& meta,
                                   ReadValues base, WriteValues write = nullptr,
                                   size_t chunk = 1000) {
  FrameEncoder encoder(model, chunk);
  SHOAL_ASSIGN_OR_RETURN(FrameDecoder decoder,
                         FrameDecoder::ForMeta(meta, {}, false, write, std::move(base)));
  TensorFrame frame;
  while (encoder.Next(&frame)) {
    if (absl::Status s = decoder.Add(frame); !s.ok()) return s;
  }
  return std::move(decoder).Finish();
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(XorDeltaTest, RoundTripIsBitExactAndSmaller) {
  auto base = RandomModel(Specs(), 1);
  auto next = NextVersion(*base, 2);
  // Values no arithmetic would round-trip: -0, a subnormal, a NaN payload, an infinity.
  next->values[0] = -0.0f;
  next->values[1] = 1e-40f;
  const uint32_t nan_bits = 0x7fc01234;
  std::memcpy(&next->values[2], &nan_bits, sizeof nan_bits);
  next->values[3] = std::numeric_limits<float>::infinity();
  auto encoded = EncodeXorDelta(next, *base);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const EncodedModel& e = **encoded;
  EXPECT_EQ(e.encodings[0].encoding, ENCODING_XOR_SPARSE_ZLIB);
  EXPECT_EQ(e.encodings[1].encoding, ENCODING_RAW) << "4 bytes do not deflate smaller";
  EXPECT_EQ(e.encodings[2].encoding, ENCODING_RAW);
  EXPECT_EQ(e.encodings[3].encoding, ENCODING_XOR_SPARSE_ZLIB);
  EXPECT_LT(e.payload_bytes(), next->layout.total_bytes() * 3 / 4);

  // Whole, and streamed into a writer in pieces (chunks that split values and zlib blocks).
  auto got = Download(e, MetaOf(next->layout, 0), ReaderOf(*base));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitEqual(got->values, next->values));
  std::vector<float> into(next->values.size());
  auto streamed = Download(
      e, MetaOf(next->layout, 0), ReaderOf(*base),
      [&](size_t first, absl::Span<const float> values) {
        std::memcpy(into.data() + first, values.data(), values.size() * sizeof(float));
        return absl::OkStatus();
      },
      /*chunk=*/333);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(BitEqual(into, next->values));
}

// A version whose round changed a few values (top-k updates: each peer's 1 %, four peers): the
// download costs the changed values and their places, not the model: a bitmap names them, then
// only their bytes follow (4.x bytes a changed value here; every value's XOR bytes, with deflate
// finding its runs as runs, took 6.6, and with its default search 9.7).
TEST(XorDeltaTest, AVersionThatChangedFewValuesCostsFewBytesEach) {
  auto base = RandomModel({{"w", {1000, 1000}}}, 1);
  auto next = std::make_shared<FlatModel>(*base);
  std::mt19937 gen(4);
  std::uniform_int_distribution<size_t> place(0, next->values.size() - 1);
  std::normal_distribution<float> step(0.0f, 1e-3f);
  size_t changed = 0;
  for (int i = 0; i < 40000; ++i) {
    float& v = next->values[place(gen)];
    const float was = v;
    v += step(gen);
    changed += v != was ? 1 : 0;
  }
  auto encoded = EncodeXorDelta(next, *base);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const double per_value = static_cast<double>((*encoded)->payload_bytes()) / changed;
  std::printf("%zu values changed: %.2f bytes each\n", changed, per_value);
  EXPECT_LT(per_value, 5.5);
  auto got = Download(**encoded, MetaOf(next->layout, 0), ReaderOf(*base));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitEqual(got->values, next->values));
}

TEST(XorDeltaTest, UnrelatedValuesAndOtherLayoutsFallBack) {
  auto base = RandomModel(Specs(), 1);
  auto noise = std::make_shared<FlatModel>(*base);
  std::mt19937 gen(3);
  for (float& v : noise->values) {
    const uint32_t bits = gen();
    std::memcpy(&v, &bits, sizeof bits);
  }
  auto encoded = EncodeXorDelta(noise, *base);
  ASSERT_TRUE(encoded.ok());
  for (const TensorEncoding& e : (*encoded)->encodings) EXPECT_EQ(e.encoding, ENCODING_RAW);
  auto got = Download(**encoded, MetaOf(noise->layout, 0), ReaderOf(*base));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitEqual(got->values, noise->values));

  auto other = RandomModel({{"fc.weight", {10, 4000}}}, 4);
  EXPECT_EQ(EncodeXorDelta(other, *base).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(XorDeltaTest, AnEncodingStopsAtTheBlockAfterItIsToldTo) {
  auto base = RandomModel({{"w", {10 * static_cast<int64_t>(kXorBlockValues)}}}, 1);
  auto next = NextVersion(*base, 2);
  int asked = 0;
  auto stopped = EncodeXorDelta(next, *base, [&asked] { return ++asked < 3; });
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 3) << "asked before each block, and no block after the answer was no";
  asked = 0;
  auto whole = EncodeXorDelta(next, *base, [&asked] { return ++asked > 0; });
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(asked, 10);
  EXPECT_EQ((*whole)->encodings[0].encoding, ENCODING_XOR_SPARSE_ZLIB);
}

// A tensor of several segments (2 MiB of values each, deflated on their own and joined into one
// zlib stream): the same bytes whether the calling thread makes every segment or helper threads
// make some, and the stream a peer inflates is a standard one (zlib's own uncompress reads it).
TEST(XorDeltaTest, SegmentsMadeOnSeveralThreadsMakeTheSameStream) {
  const int64_t big = 5 * 64 * static_cast<int64_t>(kXorBlockValues) / 2 + 77;  // 2.5 segments
  auto base = RandomModel({{"big", {big}}, {"small", {300}}, {"fc", {3, 65536 * 9}}}, 1);
  auto next = NextVersion(*base, 2);
  auto alone = EncodeXorDelta(next, *base);
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::atomic<int> asked{0};
  auto helped = EncodeXorDelta(
      next, *base, [&asked] { return ++asked > 0; }, /*threads=*/4);
  ASSERT_TRUE(helped.ok()) << helped.status();
  ASSERT_EQ((*alone)->payloads.size(), (*helped)->payloads.size());
  for (size_t t = 0; t < (*alone)->payloads.size(); ++t) {
    EXPECT_EQ((*alone)->encodings[t].encoding, ENCODING_XOR_SPARSE_ZLIB) << t;
    EXPECT_TRUE((*alone)->payloads[t] == (*helped)->payloads[t]) << "tensor " << t;
  }
  int blocks = 0;
  for (const TensorSpec& t : next->layout.tensors()) {
    blocks += static_cast<int>((t.NumElements() + kXorBlockValues - 1) / kXorBlockValues);
  }
  EXPECT_EQ(asked.load(), blocks) << "asked before each block, from whichever thread";
  auto got = Download(**helped, MetaOf(next->layout, 0), ReaderOf(*base), nullptr, 4099);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitEqual(got->values, next->values));
  // zlib's own reader takes the joined stream whole (its header, segments and Adler-32).
  const absl::string_view stream = (*helped)->payloads[0];
  size_t bound = 0;  // every value changed (nearly all do): the bitmaps and every value
  for (int64_t at = 0; at < big; at += kXorBlockValues) {
    bound += XorBlockBound(static_cast<size_t>(std::min<int64_t>(kXorBlockValues, big - at)));
  }
  std::vector<uint8_t> planes(bound);
  uLongf size = planes.size();
  EXPECT_EQ(uncompress(planes.data(), &size, reinterpret_cast<const Bytef*>(stream.data()),
                       stream.size()),
            Z_OK);
  EXPECT_LE(size, bound);
  EXPECT_GT(size, static_cast<size_t>(big) * 4 * 99 / 100);
  // Stopped from another thread's side too.
  std::atomic<int> left{5};
  auto stopped = EncodeXorDelta(
      next, *base, [&left] { return --left > 0; }, /*threads=*/3);
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
}

// One XOR_SPARSE_ZLIB tensor "w" of `elements` values with `payload` and the digest of `values`.
EncodedModel OneTensor(uint64_t elements, std::string payload, const std::vector<float>& values) {
  EncodedModel m;
  m.layout = *ModelLayout::Create({{"w", {static_cast<int64_t>(elements)}}});
  m.encodings.push_back({ENCODING_XOR_SPARSE_ZLIB});
  m.storage.push_back(std::move(payload));
  m.payloads.emplace_back(m.storage.back());
  m.digests.push_back(DigestBytes(values.data(), values.size() * sizeof(float)));
  return m;
}

// The zlib stream of XOR `bits` (one block: at most kXorBlockValues) as tensor.proto lays it out.
std::string Deflate(const std::vector<uint32_t>& bits) {
  std::vector<uint8_t> block(XorBlockBound(bits.size()));
  const size_t len = WriteXorBlock(bits, block.data());
  uLongf size = compressBound(len);
  std::string out(size, '\0');
  EXPECT_EQ(compress(reinterpret_cast<Bytef*>(out.data()), &size, block.data(), len), Z_OK);
  out.resize(size);
  return out;
}

class XorDeltaCorruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = RandomModel({{"w", {1000}}}, 5);
    next_ = NextVersion(*base_, 6);
    std::vector<uint32_t> bits(1000);
    for (size_t i = 0; i < bits.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &next_->values[i], 4);
      std::memcpy(&b, &base_->values[i], 4);
      bits[i] = a ^ b;
    }
    deflated_ = Deflate(bits);
    ASSERT_LT(deflated_.size(), 4000u);
  }
  absl::Status Try(std::string payload, uint64_t elements = 1000) {
    const EncodedModel m = OneTensor(elements, std::move(payload), next_->values);
    ModelMeta meta = MetaOf(m.layout, 0);
    return Download(m, meta, ReaderOf(*base_), nullptr).status();
  }
  std::shared_ptr<FlatModel> base_, next_;
  std::string deflated_;
};

TEST_F(XorDeltaCorruptTest, TheIntactStreamDecodes) { EXPECT_TRUE(Try(deflated_).ok()); }

TEST_F(XorDeltaCorruptTest, FlippedBytesAreRefused) {
  for (size_t at : {size_t{0}, size_t{1}, deflated_.size() / 2, deflated_.size() - 1}) {
    std::string bad = deflated_;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    const absl::Status s = Try(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << at << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("tensor 'w'")) << at;
  }
}

TEST_F(XorDeltaCorruptTest, TruncatedAndTrailingDataAreRefused) {
  EXPECT_THAT(Try(deflated_.substr(0, deflated_.size() - 3)).message(), HasSubstr("truncated"));
  EXPECT_THAT(Try(deflated_.substr(0, deflated_.size() / 2)).message(), HasSubstr("truncated"));
  EXPECT_THAT(Try(deflated_ + "xy").message(), HasSubstr("follow the end"));
  // A stream that inflates to more values than the header's shape.
  EXPECT_THAT(Try(Deflate(std::vector<uint32_t>(5000, 0)), 100).message(),
              HasSubstr("more than the tensor"));
  EXPECT_THAT(Try("not zlib at all").message(), HasSubstr("corrupt"));
}

TEST_F(XorDeltaCorruptTest, ABitmapNamingValuesPastItsBlockIsRefused) {
  // 13 values: two bytes of bitmap, of which bits 13 to 15 name no value.
  std::vector<uint32_t> bits(13, 0);
  bits[2] = 0x00010203;
  std::vector<uint8_t> block(XorBlockBound(bits.size()));
  const size_t len = WriteXorBlock(bits, block.data());
  ASSERT_EQ(len, 2u + 4u);
  ASSERT_EQ(block[0], 0x04);
  block[1] = 0x20;  // bit 13
  uLongf size = compressBound(len);
  std::string bad(size, '\0');
  ASSERT_EQ(compress(reinterpret_cast<Bytef*>(bad.data()), &size, block.data(), len), Z_OK);
  bad.resize(size);
  EXPECT_THAT(Try(bad, 13).message(), HasSubstr("names values past its 13"));
}

TEST_F(XorDeltaCorruptTest, TheWrongBaseFailsTheDigest) {
  const EncodedModel m = OneTensor(1000, deflated_, next_->values);
  auto other = NextVersion(*base_, 7);
  auto got = Download(m, MetaOf(m.layout, 0), ReaderOf(*other));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("digest mismatch"));
}

TEST_F(XorDeltaCorruptTest, NoBaseNoXorAndNoXorInUpdates) {
  const EncodedModel m = OneTensor(1000, deflated_, next_->values);
  auto got = Download(m, MetaOf(m.layout, 0), nullptr);
  EXPECT_THAT(got.status().message(), HasSubstr("no base model"));
  FrameEncoder encoder(m);
  FrameDecoder update = FrameDecoder::ForLayout(m.layout, /*require_finite=*/true);
  TensorFrame frame;
  ASSERT_TRUE(encoder.Next(&frame));
  EXPECT_THAT(update.Add(frame).message(), HasSubstr("no base model"));
}

}  // namespace
}  // namespace shoal::tensor
