// AggregatorService over real gRPC, the parts that depend on the task's aggregation: rounds with
// a strategy and its note, the federated-async buffer (OpenBuffer, round-0 pushes,
// VersionPublished on a WatchTask stream) and the --max-buffer-bytes refusals.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/aggregator_service_fixture.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class AggregatorStrategyServiceTest : public AggregatorServiceFixture {
 protected:
  absl::Status OpenBuffer(const v1::OpenBufferRequest& request) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    v1::OpenBufferResponse response;
    return rpc::FromGrpcStatus(stub_->OpenBuffer(&ctx, request, &response));
  }

  absl::Status OpenRound(const v1::OpenRoundRequest& request) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    v1::OpenRoundResponse response;
    return rpc::FromGrpcStatus(stub_->OpenRound(&ctx, request, &response));
  }

  // The number of observations of a histogram.
  double Histogram(const std::string& name) {
    for (const auto& family : server_->registry().Collect()) {
      if (family.name == name && !family.metric.empty()) {
        return static_cast<double>(family.metric[0].histogram.sample_count);
      }
    }
    ADD_FAILURE() << "no histogram " << name;
    return -1;
  }
};

TEST_F(AggregatorStrategyServiceTest, BufferPublishesVersionsAnnouncedOnWatchTask) {
  tensor::FlatModel base = Filled([](size_t i) { return 0.001f * (i % 1000); });
  ASSERT_TRUE(Put("t", 0, base).ok());

  grpc::ClientContext watch;
  rpc::SetTimeout(watch, absl::Seconds(60));
  v1::WatchTaskRequest watch_request;
  watch_request.set_task("t");
  std::unique_ptr<grpc::ClientReader<v1::TaskEvent>> events =
      stub_->WatchTask(&watch, watch_request);
  v1::TaskEvent event;
  ASSERT_TRUE(events->Read(&event));
  ASSERT_TRUE(event.has_started());
  EXPECT_EQ(event.started().latest_version(), 0u);

  v1::OpenBufferRequest open;
  open.set_task("t");
  open.set_base_version(0);
  open.mutable_async()->set_buffer_size(2);
  open.mutable_async()->set_max_staleness(0);
  ASSERT_TRUE(OpenBuffer(open).ok());
  ASSERT_TRUE(OpenBuffer(open).ok());  // idempotent

  tensor::FlatModel d1 = Filled([](size_t) { return 0.5f; });
  tensor::FlatModel d2 = Filled([](size_t i) { return (i % 2) ? 1.0f : -1.0f; });
  auto pushed = Push(Meta("p1", 100, "t", /*round=*/0, /*base=*/0), d1);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(*pushed);
  pushed = Push(Meta("p2", 300, "t", 0, 0), d2);
  ASSERT_TRUE(pushed.ok()) << pushed.status();

  // Both acceptances, then the version (aggregated on the executor after p2's answer).
  std::vector<std::string> accepted;
  std::optional<v1::VersionPublished> published;
  while (!published.has_value() && events->Read(&event)) {
    if (event.has_push_accepted()) {
      EXPECT_EQ(event.push_accepted().round(), 0u);
      accepted.push_back(event.push_accepted().peer_id());
    }
    if (event.has_version_published()) published = event.version_published();
  }
  ASSERT_TRUE(published.has_value()) << "the watch ended without a VersionPublished";
  EXPECT_THAT(accepted, ElementsAre("p1", "p2"));
  EXPECT_EQ(published->version(), 1u);
  EXPECT_THAT(published->contributors(), ElementsAre("p1", "p2"));
  EXPECT_EQ(published->num_samples(), 400u);
  EXPECT_DOUBLE_EQ(published->mean_train_loss(), 0.25);
  EXPECT_EQ(published->mean_staleness(), 0);
  EXPECT_GT(published->published_unix_ms(), 0);
  auto got = Get("t");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.version(), 1u);
  EXPECT_EQ(got->model.Digest(), published->digest_xxh3());
  for (size_t i = 0; i < base.values.size(); ++i) {
    const float want = base.values[i] + (100 * d1.values[i] + 300 * d2.values[i]) / 400;
    ASSERT_FLOAT_EQ(got->model.values[i], want) << i;
  }

  // max_staleness 0: an update of version 0 is now too old.
  absl::Status stale = Push(Meta("p1", 100, "t", 0, 0), d1).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.message(), HasSubstr("max_staleness 0"));
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "stale"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_versions_published_total"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_buffered_updates"), 0);
  EXPECT_EQ(Histogram("shoal_aggregator_update_staleness_versions"), 2);

  watch.TryCancel();
  EXPECT_EQ(events->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(AggregatorStrategyServiceTest, RoundRunsItsStrategyAndCloseRoundCarriesTheNote) {
  tensor::FlatModel base = Filled([](size_t) { return 1.0f; });
  ASSERT_TRUE(Put("t", 0, base).ok());
  v1::OpenRoundRequest open;
  open.set_task("t");
  open.set_round(1);
  open.set_base_version(0);
  open.add_expected_peers("p1");
  open.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_KRUM);
  open.mutable_aggregation()->mutable_options()->set_byzantine_peers(1);
  ASSERT_TRUE(OpenRound(open).ok());
  tensor::FlatModel d = Filled([](size_t i) { return 0.25f * (i % 4); });
  ASSERT_TRUE(Push(Meta("p1", 10), d).ok());
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->version(), 1u);
  EXPECT_THAT(closed->note(), HasSubstr("krum: 1 updates are too few"));
  auto got = Get("t");
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < base.values.size(); ++i) {
    ASSERT_FLOAT_EQ(got->model.values[i], 1.0f + d.values[i]) << i;  // the median of one
  }
}

// The default --max-buffer-bytes is 4 GiB: 4000 updates of this ~1.2 MiB model are over it.
TEST_F(AggregatorStrategyServiceTest, TooMuchUpdateMemoryIsResourceExhausted) {
  ASSERT_TRUE(Put("t", 0, Filled([](size_t) { return 1.0f; })).ok());
  v1::OpenRoundRequest round;
  round.set_task("t");
  round.set_round(1);
  round.set_base_version(0);
  for (int p = 0; p < 4000; ++p) round.add_expected_peers(absl::StrCat("p", p));
  round.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_MEDIAN);
  absl::Status s = OpenRound(round);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "round 1 of task 't': median holds up to 4000 updates × 1.2 MiB = 4.8 GiB, over this "
            "aggregator's --max-buffer-bytes 4.0 GiB");
  round.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_MEAN);
  EXPECT_TRUE(OpenRound(round).ok());  // one running sum

  v1::OpenBufferRequest buffer;
  buffer.set_task("t");
  buffer.mutable_async()->set_buffer_size(4000);
  s = OpenBuffer(buffer);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the buffer of task 't' (mean) holds up to 4000 updates × 1.2 MiB = 4.8 GiB, over "
            "this aggregator's --max-buffer-bytes 4.0 GiB");
  EXPECT_EQ(Metric("shoal_aggregator_max_buffer_refusals_total"), 2);
}

}  // namespace
}  // namespace shoal::aggregator
