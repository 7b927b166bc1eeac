// UpdateEncoder (libs/privacy/secagg/update_codec.h): block by block, the same values as
// ClipAndEncode and ClampAndEncode, and the same refusals; ApplyMeanOfSumInto a kept buffer.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/fixed_point.h"
#include "libs/privacy/secagg/update_codec.h"

namespace shoal::privacy::secagg {
namespace {

using ::testing::HasSubstr;

std::vector<uint32_t> InBlocks(const UpdateEncoder& encoder, size_t block) {
  std::vector<uint32_t> out(encoder.size());
  for (size_t start = 0; start < out.size(); start += block) {
    const size_t n = std::min(block, out.size() - start);
    EXPECT_TRUE(encoder.EncodeTo(start, absl::MakeSpan(out).subspan(start, n)).ok());
  }
  return out;
}

TEST(UpdateEncoderTest, BlocksEncodeAsTheWholeUpdateDoes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> value(0.0F, 0.05F);
  for (double noise : {0.0, 0.01}) {
    const FixedPointCodec codec = *UpdateCodec(1.0, 16, noise);
    // Long enough that its norm passes the clip norm: the clip scales it down.
    std::vector<float> update(10007);
    for (float& v : update) v = value(rng);
    update[5] = 3.0F;  // past the range: clamped when the noise is on
    const std::vector<uint32_t> whole =
        noise > 0 ? *ClampAndEncode(codec, update) : *ClipAndEncode(codec, update);
    const UpdateEncoder encoder =
        noise > 0 ? *UpdateEncoder::Clamp(codec, update) : *UpdateEncoder::Clip(codec, update);
    for (size_t block : {size_t{1}, size_t{4096}, update.size()}) {
      EXPECT_EQ(InBlocks(encoder, block), whole) << "noise " << noise << " block " << block;
    }
  }
}

TEST(UpdateEncoderTest, ANonFiniteValueIsRefusedBeforeAnyEncoding) {
  const FixedPointCodec codec = *UpdateCodec(1.0, 4, 0.0);
  std::vector<float> update(100, 0.01F);
  update[42] = std::numeric_limits<float>::quiet_NaN();
  for (const auto& encoder :
       {UpdateEncoder::Clip(codec, update), UpdateEncoder::Clamp(codec, update)}) {
    ASSERT_FALSE(encoder.ok());
    EXPECT_THAT(encoder.status().message(), HasSubstr("update value 42 is not finite"));
    EXPECT_EQ(encoder.status().message(), ClipAndEncode(codec, update).status().message());
  }
}

TEST(ApplyMeanOfSumTest, IntoAKeptBufferTheSameBitsAsAFreshOne) {
  const FixedPointCodec codec = *UpdateCodec(1.0, 4, 0.0);
  std::vector<float> base(1000);
  std::vector<uint32_t> sum(base.size(), 0);
  for (size_t i = 0; i < base.size(); ++i) {
    base[i] = 0.001F * static_cast<float>(i);
    const std::vector<float> one = {0.01F * std::sin(static_cast<float>(i))};
    for (int peer = 0; peer < 3; ++peer) sum[i] += (*ClipAndEncode(codec, one))[0];
  }
  const std::vector<float> fresh = *ApplyMeanOfSum(codec, sum, 3, base);
  for (size_t kept : {size_t{0}, size_t{10}, base.size(), size_t{4000}}) {
    std::vector<float> out(kept, -7.0F);  // an earlier version's values
    ASSERT_TRUE(ApplyMeanOfSumInto(codec, sum, 3, base, out).ok());
    EXPECT_EQ(out, fresh) << "a buffer of " << kept;
  }
  // An error leaves the buffer as it was.
  std::vector<float> out(5, -7.0F);
  EXPECT_FALSE(ApplyMeanOfSumInto(codec, absl::MakeSpan(sum).subspan(1), 3, base, out).ok());
  EXPECT_EQ(out, std::vector<float>(5, -7.0F));
}

}  // namespace
}  // namespace shoal::privacy::secagg
