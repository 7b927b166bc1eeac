// Model downloads against the version a peer holds (GetModelRequest.base_version), over real
// gRPC: an in-process shoal-aggregator on 127.0.0.1:0 serving a peer's GrpcAggregatorClient,
// and the peer's measure of its last download (GetModelRequest.download_bytes_per_second).
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "tests/service/aggregator_service_fixture.h"
#include "tests/testing/wait.h"

namespace shoal::aggregator {
namespace {

using ::testing::HasSubstr;

class AggregatorDownloadTest : public AggregatorServiceFixture {
 protected:
  // Version 0 (`base_`) and version 1 (`next_`: one round of a small update) of task "t".
  void SetUp() override {
    AggregatorServiceFixture::SetUp();
    base_ = Filled([](size_t i) { return std::sin(0.001f * i); });
    ASSERT_TRUE(Put("t", 0, base_).ok());
    ASSERT_TRUE(Open("t", 1, 0, {"p1"}).ok());
    ASSERT_TRUE(
        Push(Meta("p1", 10), Filled([](size_t i) { return 1e-4f * std::cos(0.01f * i); })).ok());
    ASSERT_TRUE(Close("t", 1).ok());
    auto next = Get("t", 1);
    ASSERT_TRUE(next.ok()) << next.status();
    next_ = std::move(next->model);
  }

  // GetModelInto version `version` holding `held` (its values `held_values`) as a peer does;
  // the values written land in `into_`.
  absl::StatusOr<AggregatorClient::ModelDownload> Download(uint64_t version,
                                                           const tensor::FlatModel* held,
                                                           uint64_t held_version) {
    into_.assign(next_.values.size(), -1.0f);
    AggregatorClient::HeldModel model{held_version, [held](size_t first, absl::Span<float> out) {
                                        std::memcpy(out.data(), held->values.data() + first,
                                                    out.size() * sizeof(float));
                                        return absl::OkStatus();
                                      }};
    return client_.GetModelInto(
        server_->address(), "t", version, {peer_, ""}, absl::Now() + absl::Seconds(30),
        [&](size_t first, absl::Span<const float> values) {
          std::memcpy(into_.data() + first, values.data(), values.size() * sizeof(float));
          // A peer that takes its model slowly: the aggregator has sent everything by then.
          if (first + values.size() == into_.size()) absl::SleepFor(last_write_takes_);
          return absl::OkStatus();
        },
        held == nullptr ? nullptr : &model);
  }

  // The payload bytes a download of `version` received, raw or not.
  uint64_t SentFor(uint64_t version, const tensor::FlatModel* held, uint64_t held_version) {
    absl::StatusOr<AggregatorClient::ModelDownload> got = Download(version, held, held_version);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return 0;
    EXPECT_EQ(got->layout, next_.layout);
    return got->payload_bytes;
  }

  // Waits until the aggregator has made `n` download encodings (its metric).
  bool EncodingsMade(double n) {
    const bool made = shoal::testing::WaitUntil(
        [&] {
          for (const auto& family : server_->registry().Collect()) {
            if (family.name == "shoal_aggregator_download_encodes_total" &&
                !family.metric.empty() && family.metric[0].counter.value >= n) {
              return true;
            }
          }
          return false;
        },
        absl::Seconds(20));
    EXPECT_TRUE(made) << "no " << n << " encodings made in 20 s";
    return made;
  }

  bool IntoIsNext() const {
    return std::memcmp(into_.data(), next_.values.data(), into_.size() * sizeof(float)) == 0;
  }

  tensor::FlatModel base_, next_;
  std::vector<float> into_;
  absl::Duration last_write_takes_ = absl::ZeroDuration();
  // Who downloads: none (as the coordinator does), whose link the aggregator does not measure,
  // so a download never waits for an encoding; or a peer.
  std::string peer_;
  GrpcAggregatorClient client_;
};

TEST_F(AggregatorDownloadTest, AgainstTheHeldVersionIsSmallerAndBitExactElseRaw) {
  const uint64_t raw = SentFor(1, nullptr, 0);
  EXPECT_EQ(raw, next_.layout.total_bytes());
  EXPECT_TRUE(IntoIsNext());
  // The first download against version 0 starts the encoding and does not wait for it: it comes
  // raw, and the peer takes it as it is.
  EXPECT_EQ(SentFor(1, &base_, 0), raw);
  EXPECT_TRUE(IntoIsNext());
  ASSERT_TRUE(EncodingsMade(1));
  const uint64_t against = SentFor(1, &base_, 0);
  EXPECT_TRUE(IntoIsNext());
  EXPECT_LT(against, raw * 4 / 5) << "raw " << raw << " bytes, against version 0 " << against;
  // A second peer gets the same bytes (the same encoding).
  EXPECT_EQ(SentFor(1, &base_, 0), against);
  EXPECT_TRUE(IntoIsNext());

  // A version the aggregator does not hold, or the one asked for itself: raw.
  EXPECT_EQ(SentFor(1, &base_, 7), raw) << "version 7 was never held";
  EXPECT_TRUE(IntoIsNext());
  EXPECT_EQ(SentFor(1, &next_, 1), raw) << "the version asked for itself";
  EXPECT_TRUE(IntoIsNext());
}

TEST_F(AggregatorDownloadTest, TheNextVersionIsEncodedWhenItIsPublished) {
  EXPECT_EQ(SentFor(1, &base_, 0), next_.layout.total_bytes());  // the task downloads against held
  ASSERT_TRUE(EncodingsMade(1));
  ASSERT_TRUE(Open("t", 2, 1, {"p1"}).ok());
  ASSERT_TRUE(
      Push(Meta("p1", 10, "t", 2, 1), Filled([](size_t i) { return 1e-4f * std::sin(0.02f * i); }))
          .ok());
  ASSERT_TRUE(Close("t", 2).ok());
  // Version 2 is encoded against version 1 before any peer asked for it.
  ASSERT_TRUE(EncodingsMade(2));
  auto two = Get("t", 2);
  ASSERT_TRUE(two.ok()) << two.status();
  const tensor::FlatModel one = std::exchange(next_, std::move(two->model));
  const uint64_t against = SentFor(2, &one, 1);
  EXPECT_TRUE(IntoIsNext());
  EXPECT_LT(against, next_.layout.total_bytes() * 4 / 5) << "the round's first download";
}

TEST_F(AggregatorDownloadTest, APeerWhoseLastModelArrivedSlowlyWaitsForTheEncoding) {
  // The peer's first download ends 1 s after the aggregator has sent its 1.28 MB (the peer's
  // last write takes that long): 1.3 MB/s by the peer's measure, much faster by the aggregator's.
  // The peer's measure, sent with its next download, makes the aggregator wait for the encoding
  // against the held version (about 64 ms at the speed assumed before one is timed, saving about
  // a quarter of a second): the first download against version 0 already comes encoded.
  peer_ = "p1";
  last_write_takes_ = absl::Seconds(1);
  const uint64_t raw = SentFor(1, nullptr, 0);
  last_write_takes_ = absl::ZeroDuration();
  const uint64_t against = SentFor(1, &base_, 0);
  EXPECT_TRUE(IntoIsNext());
  EXPECT_LT(against, raw * 4 / 5) << "raw " << raw << " bytes, against version 0 " << against;
}

TEST_F(AggregatorDownloadTest, AWrongHeldModelFailsTheDownload) {
  EXPECT_TRUE(Download(1, &base_, 0).ok());  // raw, and the encoding is made
  ASSERT_TRUE(EncodingsMade(1));
  tensor::FlatModel wrong = base_;
  wrong.values[5] += 1.0f;  // the peer's copy of version 0 is not the aggregator's
  auto layout = Download(1, &wrong, 0);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("digest mismatch"));
  EXPECT_THAT(layout.status().message(), HasSubstr(server_->address()));
}

}  // namespace
}  // namespace shoal::aggregator
