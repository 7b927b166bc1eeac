#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"

namespace shoal::tensor {
namespace {

using common::v1::ENCODING_FP16;
using common::v1::ENCODING_INT8;
using common::v1::ENCODING_RAW;
using common::v1::ENCODING_SPARSE;
using common::v1::TensorFrame;
using ::testing::HasSubstr;

std::shared_ptr<FlatModel> RandomModel(std::vector<TensorSpec> specs, uint32_t seed,
                                       float scale = 1.0f) {
  auto m = std::make_shared<FlatModel>();
  m->layout = *ModelLayout::Create(std::move(specs));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  m->values.resize(m->layout.total_elements());
  for (float& v : m->values) v = normal(gen);
  return m;
}

std::vector<TensorSpec> Specs() {
  return {
      {"conv.weight", {8, 1, 5, 5}}, {"conv.bias", {8}}, {"empty", {0}}, {"fc.weight", {10, 4000}}};
}

// Streams `model` through FrameEncoder and a ForLayout decoder (what the aggregator runs).
absl::StatusOr<FlatModel> RoundTrip(const EncodedModel& model, size_t chunk = 4096) {
  FrameEncoder encoder(model, chunk);
  FrameDecoder decoder = FrameDecoder::ForLayout(model.layout, /*require_finite=*/true);
  TensorFrame frame;
  while (encoder.Next(&frame)) {
    if (absl::Status s = decoder.Add(frame); !s.ok()) return s;
  }
  return std::move(decoder).Finish();
}

TEST(HalfTest, EveryFiniteHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h << " = " << f;
  }
}

TEST(HalfTest, RoundsToNearestEvenAndClamps) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7bff);  // clamped, not infinite
  EXPECT_EQ(FloatToHalf(-1e30f), 0xfbff);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);             // the smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);             // a tie: to even (0)
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);         // a tie: to even (2)
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie below: even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie above: even
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(CompressionTest, RawIsTheModelItselfUncopied) {
  auto update = RandomModel(Specs(), 1);
  const float* data = update->values.data();
  Compressor compressor({});
  std::shared_ptr<const EncodedModel> encoded = compressor.Compress(update, 1);
  EXPECT_EQ(encoded->payloads[0].data(), reinterpret_cast<const char*>(data));
  EXPECT_EQ(encoded->payload_bytes(), update->layout.total_bytes());
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->values, update->values);
}

// A model served raw many times is hashed once: TensorDigests keeps what its first call computed
// (each tensor's XXH3, the empty one's too), and a stream sends those in its headers.
TEST(CompressionTest, TensorDigestsAreComputedOnceAndTravelInTheHeaders) {
  auto model = RandomModel(Specs(), 2);
  TensorDigests digests;
  const std::vector<uint64_t> first = digests.Of(*model);
  ASSERT_EQ(first.size(), model->layout.num_tensors());
  for (size_t t = 0; t < first.size(); ++t) {
    EXPECT_EQ(first[t], DigestBytes(model->values.data() + model->layout.offset(t),
                                    model->layout.tensors()[t].NumElements() * sizeof(float)))
        << t;
  }
  std::shared_ptr<const EncodedModel> encoded = EncodeRaw(model, first);
  EXPECT_EQ(encoded->digests, first);
  auto decoded = RoundTrip(*encoded);  // the decoder checks each tensor against its header
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->values, model->values);

  // Kept, not computed again (the model must not change: here it does, to show it).
  model->values[0] += 1.0f;
  EXPECT_EQ(digests.Of(*model), first);
  auto stale = RoundTrip(*EncodeRaw(model, first));
  EXPECT_TRUE(absl::IsInvalidArgument(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("'conv.weight': digest mismatch"));
  // Digests of another count are not used: the stream hashes the payloads itself.
  EXPECT_TRUE(EncodeRaw(model, {1, 2})->digests.empty());
  EXPECT_TRUE(RoundTrip(*EncodeRaw(model, {1, 2})).ok());
}

TEST(CompressionTest, Fp16HalvesTheBytesWithinHalfPrecision) {
  auto update = RandomModel(Specs(), 2);
  const std::vector<float> original = update->values;
  Compressor compressor({ENCODING_FP16});
  auto encoded = compressor.Compress(update, 1);
  EXPECT_EQ(encoded->payload_bytes(), update->layout.total_bytes() / 2);
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_NEAR(decoded->values[i], original[i], std::fabs(original[i]) / 1024 + 1e-7) << i;
  }
}

TEST(CompressionTest, Int8KeepsEachValueWithinHalfAStep) {
  auto update = RandomModel(Specs(), 3, 0.01f);
  const std::vector<float> original = update->values;
  Compressor compressor({ENCODING_INT8});
  auto encoded = compressor.Compress(update, 1);
  // One scale per (non-empty) tensor and a byte per value.
  EXPECT_EQ(encoded->payload_bytes(), update->layout.total_elements() + 3 * sizeof(float));
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const ModelLayout& layout = update->layout;
  for (size_t t = 0; t < layout.num_tensors(); ++t) {
    const size_t n = layout.tensors()[t].NumElements();
    const float* x = original.data() + layout.offset(t);
    float max_abs = 0;
    for (size_t i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(decoded->values[layout.offset(t) + i], x[i], max_abs / 127 / 2 * 1.001f);
    }
  }
}

TEST(CompressionTest, TopKSendsTheLargestAndFeedsTheRestBack) {
  auto u1 = RandomModel(Specs(), 4);
  auto u2 = RandomModel(Specs(), 5);
  const std::vector<float> first = u1->values;
  const std::vector<float> second = u2->values;
  Compressor compressor({ENCODING_SPARSE, 0.01, ENCODING_RAW});
  auto e1 = compressor.Compress(u1, 1);
  const ModelLayout& layout = e1->layout;
  // Per tensor, 1% rounded up: fc.weight (40,000 values) keeps 400, conv.weight (200) 2,
  // conv.bias (8) 1.
  EXPECT_EQ(e1->encodings[3].encoding, ENCODING_SPARSE);
  EXPECT_EQ(e1->encodings[3].nonzeros, 400u);
  EXPECT_EQ(e1->encodings[0].nonzeros, 2u);
  EXPECT_EQ(e1->encodings[1].nonzeros, 1u);
  auto s1 = RoundTrip(*e1);
  ASSERT_TRUE(s1.ok()) << s1.status();
  // The kept values are exactly the largest magnitudes of fc.weight.
  {
    const size_t off = layout.offset(3), n = 40000;
    std::vector<float> mags;
    for (size_t i = 0; i < n; ++i) mags.push_back(std::fabs(first[off + i]));
    std::nth_element(mags.begin(), mags.begin() + (n - 400), mags.end());
    const float threshold = mags[n - 400];
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      const float sent = s1->values[off + i];
      if (sent != 0) {
        ++kept;
        EXPECT_EQ(sent, first[off + i]);
        EXPECT_GE(std::fabs(sent), threshold);
      } else {
        EXPECT_LE(std::fabs(first[off + i]), threshold);
      }
    }
    EXPECT_EQ(kept, 400u);
  }
  EXPECT_GT(compressor.ResidualSumSquares(), 0);
  auto e2 = compressor.Compress(u2, 1);
  auto s2 = RoundTrip(*e2);
  ASSERT_TRUE(s2.ok()) << s2.status();
  // Error feedback: what was sent plus what waits equals everything ever added.
  double waiting = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    const double left = static_cast<double>(first[i]) + second[i] - s1->values[i] - s2->values[i];
    waiting += left * left;
  }
  EXPECT_NEAR(compressor.ResidualSumSquares(), waiting, 1e-4 * waiting);
}

TEST(CompressionTest, TopKWarmUpHalvesTowardsTheRatio) {
  CompressionSettings settings{ENCODING_SPARSE, 0.01, ENCODING_INT8};
  settings.topk_warmup_rounds = 3;
  Compressor compressor(settings);
  EXPECT_DOUBLE_EQ(compressor.TopKRatio(0), 0.08);
  EXPECT_DOUBLE_EQ(compressor.TopKRatio(1), 0.04);
  EXPECT_DOUBLE_EQ(compressor.TopKRatio(2), 0.02);
  EXPECT_DOUBLE_EQ(compressor.TopKRatio(3), 0.01);
  EXPECT_DOUBLE_EQ(compressor.TopKRatio(40), 0.01);
  settings.topk_ratio = 0.3;
  EXPECT_DOUBLE_EQ(Compressor(settings).TopKRatio(0), 1.0);  // capped: every value
  EXPECT_DOUBLE_EQ(Compressor(settings).TopKRatio(2), 0.6);

  // fc.weight (40,000 values) keeps 8%, then 4%, 2% and from version 3 on 1%; what was not
  // sent still waits in the residual.
  const std::pair<uint64_t, uint64_t> expected[] = {
      {0, 3200}, {1, 1600}, {2, 800}, {3, 400}, {9, 400}};
  for (const auto& [version, kept] : expected) {
    auto encoded = compressor.Compress(RandomModel(Specs(), 20 + version), version);
    EXPECT_EQ(encoded->encodings[3].encoding, ENCODING_SPARSE) << version;
    EXPECT_EQ(encoded->encodings[3].nonzeros, kept) << version;
    ASSERT_TRUE(RoundTrip(*encoded).ok()) << version;
  }
  EXPECT_GT(compressor.ResidualSumSquares(), 0);
}

TEST(CompressionTest, TopKSendsTensorsBelowTheMinimumWholeInTheValuesEncoding) {
  CompressionSettings settings{ENCODING_SPARSE, 0.01, ENCODING_INT8};
  settings.topk_min_elements = 1000;  // conv.weight (200) and conv.bias (8) go whole
  Compressor compressor(settings);
  auto update = RandomModel(Specs(), 11);
  const std::vector<float> original = update->values;
  auto encoded = compressor.Compress(update, 1);
  EXPECT_EQ(encoded->encodings[0].encoding, ENCODING_INT8);
  EXPECT_EQ(encoded->encodings[1].encoding, ENCODING_INT8);
  EXPECT_EQ(encoded->encodings[3].encoding, ENCODING_SPARSE);
  EXPECT_EQ(encoded->encodings[3].nonzeros, 400u);
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  // Every value of the small tensors arrives, to int8's rounding, which waits in the residual.
  double rounding = 0;
  for (size_t t : {0, 1}) {
    const size_t off = update->layout.offset(t);
    const size_t n = update->layout.tensors()[t].NumElements();
    float scale = 0;
    for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(original[off + i]));
    for (size_t i = 0; i < n; ++i) {
      const float error = original[off + i] - decoded->values[off + i];
      EXPECT_LE(std::fabs(error), scale / 127) << t << " " << i;
      rounding += static_cast<double>(error) * error;
    }
  }
  EXPECT_GT(rounding, 0);
  EXPECT_GE(compressor.ResidualSumSquares(), rounding * (1 - 1e-5));
  // Without the minimum, the same tensors are sparsified.
  settings.topk_min_elements = 0;
  auto all = Compressor(settings).Compress(RandomModel(Specs(), 11), 1);
  EXPECT_EQ(all->encodings[0].encoding, ENCODING_SPARSE);
  EXPECT_EQ(all->encodings[0].nonzeros, 2u);
  EXPECT_LT(all->payload_bytes(), encoded->payload_bytes());
}

TEST(CompressionTest, TopKCountsPerTensorTakeTheRatioOfEach) {
  // ceil(ratio x size), at least 1; 0 for the tensors not sparsified.
  EXPECT_EQ(TopKCounts({12800, 0, 200704, 50}, 0.01, TopKSplit::kPerTensor),
            (std::vector<uint64_t>{128, 0, 2008, 1}));
  EXPECT_EQ(TopKCounts({}, 0.01, TopKSplit::kPerTensor), std::vector<uint64_t>());
  EXPECT_EQ(TopKCounts({7, 3}, 1.0, TopKSplit::kPerTensor), (std::vector<uint64_t>{7, 3}));
}

TEST(CompressionTest, TopKCountsSplitEquallyKeepTheTotal) {
  // The CNN's two large tensors: 128 + 2,008 values split 1,068 each.
  EXPECT_EQ(TopKCounts({12800, 0, 200704}, 0.01, TopKSplit::kEqual),
            (std::vector<uint64_t>{1068, 0, 1068}));
  // An odd total: the smaller tensor, first, takes the rounded-up share.
  EXPECT_EQ(TopKCounts({200, 10100}, 0.01, TopKSplit::kEqual), (std::vector<uint64_t>{52, 51}));
  // A tensor smaller than its share goes whole; the larger ones share what it cannot take.
  // Per tensor: 1 + 100 + 100 + 200 = 401; equal: 10, then 391 / 3 rounded up and down.
  EXPECT_EQ(TopKCounts({10000, 10, 20000, 10000}, 0.01, TopKSplit::kEqual),
            (std::vector<uint64_t>{131, 10, 130, 130}));
  // Every value when the ratio is 1, whatever the split.
  EXPECT_EQ(TopKCounts({5, 300, 40}, 1.0, TopKSplit::kEqual), (std::vector<uint64_t>{5, 300, 40}));
  // Each count in 1..size, the same total as per tensor, over many shapes.
  std::mt19937 gen(5);
  std::uniform_int_distribution<uint64_t> size(0, 5000);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<uint64_t> sizes(1 + trial % 7);
    for (uint64_t& n : sizes) n = trial % 3 == 0 ? size(gen) % 20 : size(gen);
    const double ratio = std::uniform_real_distribution<double>(0.0001, 1.0)(gen);
    const std::vector<uint64_t> each = TopKCounts(sizes, ratio, TopKSplit::kPerTensor);
    const std::vector<uint64_t> equal = TopKCounts(sizes, ratio, TopKSplit::kEqual);
    uint64_t total_each = 0, total_equal = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      EXPECT_EQ(equal[t] == 0, sizes[t] == 0) << trial;
      EXPECT_LE(equal[t], sizes[t]) << trial;
      total_each += each[t];
      total_equal += equal[t];
    }
    EXPECT_EQ(total_equal, total_each) << trial;
  }
}

TEST(CompressionTest, TopKSplitEquallySendsTheSameNumberOfEachLargeTensor) {
  // conv.weight (200), conv.bias (8, under the minimum: whole) and fc.weight (40,000): at 0.5%
  // of each, 1 + 200; split equally, 101 and 100.
  CompressionSettings settings{ENCODING_SPARSE, 0.005, ENCODING_RAW};
  settings.topk_min_elements = 100;
  settings.topk_split = TopKSplit::kEqual;
  Compressor compressor(settings);
  auto update = RandomModel(Specs(), 13);
  const std::vector<float> original = update->values;
  auto encoded = compressor.Compress(update, 1);
  EXPECT_EQ(encoded->encodings[0].encoding, ENCODING_SPARSE);
  EXPECT_EQ(encoded->encodings[0].nonzeros, 101u);
  EXPECT_EQ(encoded->encodings[1].encoding, ENCODING_RAW);
  EXPECT_EQ(encoded->encodings[3].encoding, ENCODING_SPARSE);
  EXPECT_EQ(encoded->encodings[3].nonzeros, 100u);
  EXPECT_EQ(encoded->values_sent(), 101u + 8 + 100);  // conv.bias whole
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  // Each value arrives exactly or waits whole in the residual.
  double unsent = 0;
  for (size_t i = 0; i < original.size(); ++i) {
    if (decoded->values[i] != original[i]) {
      EXPECT_EQ(decoded->values[i], 0.0f) << i;
      unsent += static_cast<double>(original[i]) * original[i];
    }
  }
  EXPECT_GT(unsent, 0);
  EXPECT_NEAR(compressor.ResidualSumSquares(), unsent, unsent * 1e-5);
}

TEST(CompressionTest, TopKFallsBackToDenseWhenSparseIsNotSmaller) {
  auto update = RandomModel(Specs(), 9);
  const std::vector<float> original = update->values;
  Compressor compressor({ENCODING_SPARSE, 1.0, ENCODING_RAW});
  auto encoded = compressor.Compress(update, 1);
  for (const TensorEncoding& e : encoded->encodings) EXPECT_EQ(e.encoding, ENCODING_RAW);
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->values, original);
  EXPECT_EQ(compressor.ResidualSumSquares(), 0);
}

TEST(CompressionTest, TopKOfOnePercentInInt8IsOverAHundredTimesSmaller) {
  auto update = RandomModel({{"w", {1000, 1000}}}, 6);
  Compressor compressor({ENCODING_SPARSE, 0.01, ENCODING_INT8});
  auto encoded = compressor.Compress(update, 1);
  EXPECT_LT(encoded->payload_bytes() * 100, update->layout.total_bytes());
  auto decoded = RoundTrip(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(
      std::count_if(decoded->values.begin(), decoded->values.end(), [](float v) { return v != 0; }),
      10000);
}

TEST(CompressionTest, NonFiniteUpdatesTravelRawAndAreRefused) {
  auto update = RandomModel(Specs(), 7);
  update->values[update->layout.offset(3) + 17] = std::nanf("");
  for (auto codec : {ENCODING_FP16, ENCODING_INT8, ENCODING_SPARSE}) {
    auto copy = std::make_shared<FlatModel>(*update);
    Compressor compressor({codec, 0.01, ENCODING_INT8});
    auto encoded = compressor.Compress(copy, 1);
    EXPECT_EQ(encoded->encodings[3].encoding, ENCODING_RAW);
    auto decoded = RoundTrip(*encoded);
    ASSERT_FALSE(decoded.ok());
    EXPECT_THAT(decoded.status().message(), HasSubstr("non-finite value"));
  }
}

// One hand-made tensor "w" of 10 values.
absl::Status DecodeHandMade(TensorEncoding e, std::string payload) {
  auto model = std::make_shared<EncodedModel>();
  model->layout = *ModelLayout::Create({{"w", {10}}});
  model->encodings = {e};
  model->storage = {std::move(payload)};
  model->payloads = {model->storage[0]};
  return RoundTrip(*model).status();
}

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(CompressionTest, MalformedEncodingsAreRefusedByName) {
  const TensorEncoding sparse2{ENCODING_SPARSE, ENCODING_RAW, 2};
  // Indices 3 and 5 (gaps 3, 2): valid.
  EXPECT_TRUE(DecodeHandMade(sparse2, std::string("\x03\x02") + Floats({1, 2})).ok());
  const auto refused = [](absl::Status s, const std::string& what) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
    EXPECT_THAT(s.message(), HasSubstr(what));
  };
  refused(DecodeHandMade(sparse2, std::string("\x03\x07") + Floats({1, 2})), "out of range");
  refused(DecodeHandMade(sparse2, std::string("\x03\x00", 2) + Floats({1, 2})), "repeats index");
  refused(DecodeHandMade({ENCODING_SPARSE, ENCODING_RAW, 1}, std::string("\x03") + Floats({1, 2})),
          "bytes follow");
  refused(DecodeHandMade(sparse2, std::string("\x83\x80") + Floats({1, 2})), "repeats index");
  refused(DecodeHandMade({ENCODING_SPARSE, ENCODING_RAW, 11}, std::string(40, '\x01')),
          "nonzeros 11");
  refused(DecodeHandMade({ENCODING_SPARSE, ENCODING_SPARSE, 1}, "\x01\x01"), "values_encoding");
  refused(DecodeHandMade({ENCODING_SPARSE, ENCODING_RAW, 9}, std::string(41, '\x01')),
          "size_bytes 41");
  refused(DecodeHandMade({ENCODING_SPARSE, ENCODING_RAW, 1}, std::string("\x01") + Floats({NAN})),
          "non-finite");
  refused(DecodeHandMade({ENCODING_FP16}, std::string(19, '\0')), "size_bytes 19");
  std::string int8 = Floats({0.5f}) + std::string(10, '\x01');
  EXPECT_TRUE(DecodeHandMade({ENCODING_INT8}, int8).ok());
  int8[7] = '\x80';
  refused(DecodeHandMade({ENCODING_INT8}, int8), "-128");
  refused(DecodeHandMade({ENCODING_INT8}, Floats({-1.0f}) + std::string(10, '\x01')), "scale");
  refused(DecodeHandMade({ENCODING_INT8}, Floats({INFINITY}) + std::string(10, '\x01')), "scale");
  refused(DecodeHandMade({static_cast<common::v1::Encoding>(9)}, Floats({1})), "encoding");
}

TEST(CompressionTest, ModelsTravelRawOnly) {
  auto update = RandomModel(Specs(), 8);
  Compressor compressor({ENCODING_FP16});
  auto encoded = compressor.Compress(update, 1);
  auto decoder = FrameDecoder::ForMeta(MakeModelMeta("t", 1, encoded->layout), DecoderLimits{},
                                       /*require_finite=*/true);
  ASSERT_TRUE(decoder.ok());
  FrameEncoder encoder(*encoded);
  TensorFrame frame;
  ASSERT_TRUE(encoder.Next(&frame));
  absl::Status s = decoder->Add(frame);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("only accepted in updates"));
}

}  // namespace
}  // namespace shoal::tensor
