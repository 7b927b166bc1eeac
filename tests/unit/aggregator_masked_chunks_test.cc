// A masked update across several SecureAggregate messages (services/aggregator/masked_chunks.h):
// the peer's side splits it (the aggregator's side folds each chunk: privacy_secagg_chunks_test).

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/aggregator/masked_chunks.h"

namespace shoal::aggregator {
namespace {

using ::testing::HasSubstr;

v1::SecureAggregationRequest Masked(const std::string& peer, const std::string& values) {
  v1::SecureAggregationRequest request;
  v1::SecureMaskedUpdate& masked = *request.mutable_masked();
  masked.mutable_input()->set_participant_id(peer);
  masked.mutable_input()->set_values(values);
  masked.set_num_samples(7);
  masked.set_train_loss(0.25);
  masked.set_train_ms(40);
  return request;
}

std::vector<v1::SecureAggregationRequest> Written(const v1::SecureAggregationRequest& request,
                                                  size_t chunk_bytes) {
  std::vector<v1::SecureAggregationRequest> written;
  EXPECT_TRUE(WriteMaskedInChunks(
      request,
      [&](const v1::SecureAggregationRequest& m) {
        written.push_back(m);
        return true;
      },
      chunk_bytes));
  return written;
}

TEST(MaskedChunksTest, AnUpdateThatFitsGoesAsItIs) {
  const v1::SecureAggregationRequest request = Masked("p", "abcdefgh");
  std::vector<v1::SecureAggregationRequest> written = Written(request, 8);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].SerializeAsString(), request.SerializeAsString());
  // Other steps are never split.
  v1::SecureAggregationRequest keys;
  keys.mutable_keys()->set_participant_id("p");
  EXPECT_EQ(Written(keys, 1).size(), 1u);
}

TEST(MaskedChunksTest, ALargerUpdateGoesInChunksWithItsReportOnTheFirst) {
  std::vector<v1::SecureAggregationRequest> written = Written(Masked("p", "abcdefghij"), 4);
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written[0].masked().input().values(), "abcd");
  EXPECT_EQ(written[1].masked().input().values(), "efgh");
  EXPECT_EQ(written[2].masked().input().values(), "ij");
  EXPECT_EQ(written[0].masked().num_samples(), 7u);
  EXPECT_EQ(written[0].masked().train_ms(), 40);
  for (size_t i = 1; i < written.size(); ++i) {
    EXPECT_EQ(written[i].masked().num_samples(), 0u);
    EXPECT_EQ(written[i].masked().train_loss(), 0.0);
    EXPECT_EQ(written[i].masked().input().participant_id(), "p");
  }
  // A write that fails stops the rest.
  int calls = 0;
  EXPECT_FALSE(WriteMaskedInChunks(
      Masked("p", "abcdefghij"), [&](const v1::SecureAggregationRequest&) { return ++calls < 2; },
      4));
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace shoal::aggregator
