// AggregatorService over real gRPC: an in-process shoal-aggregator server on 127.0.0.1:0 with a
// fake coordinator RegistryService as its neighbour.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "tests/service/aggregator_service_fixture.h"
#include "tests/testing/wait.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class AggregatorServiceTest : public AggregatorServiceFixture {};

TEST_F(AggregatorServiceTest, RegistersWithTheCoordinatorAndKeepsRefreshing) {
  registry_.set_want(3);  // heartbeat interval 200 ms
  auto addresses = registry_.WaitFor(3, absl::Seconds(20));
  ASSERT_GE(addresses.size(), 3u);
  EXPECT_EQ(addresses[0], server_->address());
  EXPECT_TRUE(server_->registered());
}

// Registrations list the tasks held; a task the coordinator's answer names is freed.
TEST_F(AggregatorServiceTest, ATaskARegistrationAnswerNamesIsFreed) {
  tensor::FlatModel m = Filled([](size_t i) { return 0.5f * i; });
  ASSERT_TRUE(Put("kept", 0, m).ok());
  ASSERT_TRUE(Put("ended", 0, m).ok());
  ASSERT_TRUE(registry_.WaitForTasks({"ended", "kept"}, absl::Seconds(20)));
  registry_.set_release({"ended", "another coordinator's"});
  ASSERT_TRUE(registry_.WaitForTasks({"kept"}, absl::Seconds(20)));
  EXPECT_EQ(Get("ended").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Get("kept").ok());
  EXPECT_EQ(Metric("shoal_aggregator_tasks"), 1);
}

TEST_F(AggregatorServiceTest, PutThenGetReturnsTheSameModel) {
  tensor::FlatModel m = Filled([](size_t i) { return std::sin(0.001f * i); });
  auto put = Put("t", 0, m);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->version(), 0u);
  EXPECT_EQ(put->digest_xxh3(), m.Digest());
  auto got = Get("t");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.version(), 0u);
  EXPECT_EQ(got->model.layout, m.layout);
  EXPECT_EQ(got->model.values, m.values);
  EXPECT_GE(Metric("shoal_aggregator_bytes_received_total"), m.layout.total_bytes());
  // The server counts sent bytes when its side of the call is done, which may be just after
  // the client has read everything.
  EXPECT_TRUE(shoal::testing::WaitUntil(
      [&] { return Metric("shoal_aggregator_bytes_sent_total") >= m.layout.total_bytes(); },
      absl::Seconds(10)))
      << Metric("shoal_aggregator_bytes_sent_total");
  EXPECT_EQ(Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Get("t", 3).status().code(), absl::StatusCode::kNotFound);
}

// Once the coordinator has set a task's members, a peer's upload or download needs its current
// session token; the coordinator's own calls (no peer id) still work.
TEST_F(AggregatorServiceTest, PeerCallsNeedTheirSessionToken) {
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    aggregator::v1::SetMembersRequest request;
    request.set_task("t");
    (*request.mutable_session_tokens())["peer-a"] = "token-a";
    aggregator::v1::SetMembersResponse response;
    ASSERT_TRUE(stub_->SetMembers(&ctx, request, &response).ok());
  }
  auto model = std::make_shared<const tensor::FlatModel>(Filled([](size_t i) { return 1.0f; }));
  auto put = [&](const std::string& peer, const std::string& token) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::PutModelRequest first;
    *first.mutable_meta() = tensor::MakeModelMeta("t", 0, *model);
    first.set_peer_id(peer);
    first.set_session_token(token);
    auto channel = rpc::MakeChannel(server_->address());
    return rpc::PutModelZeroCopy(*channel, ctx, first, tensor::EncodeRaw(model)).status().code();
  };
  EXPECT_EQ(put("peer-a", "guess"), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(put("peer-b", "token-a"), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Get("t").status().code(), absl::StatusCode::kNotFound) << "nothing was stored";
  EXPECT_EQ(put("peer-a", "token-a"), absl::StatusCode::kOk);

  auto get = [&](const std::string& peer, const std::string& token) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::GetModelRequest request;
    request.set_task("t");
    request.set_peer_id(peer);
    request.set_session_token(token);
    auto reader = stub_->GetModel(&ctx, request);
    return rpc::ReadModelStream(*reader, {}, &ctx).status().code();
  };
  EXPECT_EQ(get("peer-a", "wrong"), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(get("peer-a", "token-a"), absl::StatusCode::kOk);
  EXPECT_TRUE(Get("t").ok());  // the coordinator's checkpoint download: no peer id
  EXPECT_GE(Metric("shoal_aggregator_updates_rejected_total", "unauthenticated"), 3);
}

TEST_F(AggregatorServiceTest, TwoPushesGiveTheExactWeightedMean) {
  tensor::FlatModel base = Filled([](size_t i) { return 0.001f * (i % 1000); });
  ASSERT_TRUE(Put("t", 0, base).ok());
  ASSERT_TRUE(Open("t", 1, 0, {"p1", "p2"}).ok());
  tensor::FlatModel d1 = Filled([](size_t i) { return 0.5f; });
  tensor::FlatModel d2 = Filled([](size_t i) { return (i % 2) ? 1.0f : -1.0f; });
  auto r1 = Push(Meta("p1", 100), d1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_FALSE(*r1);
  auto r2 = Push(Meta("p2", 300), d2);
  ASSERT_TRUE(r2.ok()) << r2.status();
  // A repeat is acknowledged as a duplicate.
  auto again = Push(Meta("p2", 300), d2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);

  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->version(), 1u);
  EXPECT_THAT(closed->contributors(), ElementsAre("p1", "p2"));
  EXPECT_EQ(closed->num_samples(), 400u);
  EXPECT_DOUBLE_EQ(closed->mean_train_loss(), 0.25);
  auto got = Get("t");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->meta.version(), 1u);
  EXPECT_EQ(got->model.Digest(), closed->digest_xxh3());
  for (size_t i = 0; i < base.values.size(); ++i) {
    const float want = base.values[i] + (100 * d1.values[i] + 300 * d2.values[i]) / 400;
    ASSERT_FLOAT_EQ(got->model.values[i], want) << i;
  }
  EXPECT_EQ(Metric("shoal_aggregator_updates_accepted_total"), 2);
  EXPECT_EQ(Metric("shoal_aggregator_rounds_completed_total"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_model_version"), 1);
  // The previous version stays available.
  auto previous = Get("t", 0);
  ASSERT_TRUE(previous.ok());
  EXPECT_EQ(previous->model.values, base.values);
}

TEST_F(AggregatorServiceTest, BadDeltasAreRejectedCountedAndNeverAveragedIn) {
  tensor::FlatModel base = Filled([](size_t i) { return 1.0f; });
  ASSERT_TRUE(Put("t", 0, base).ok());
  ASSERT_TRUE(Open("t", 1, 0, {"good", "bad"}, /*max_norm=*/1000).ok());
  tensor::FlatModel good = Filled([](size_t) { return 0.5f; });

  auto frames_of = [](const tensor::FlatModel& m) {
    std::vector<common::v1::TensorFrame> frames;
    tensor::FrameEncoder enc(m);
    common::v1::TensorFrame f;
    while (enc.Next(&f)) frames.push_back(f);
    return frames;
  };

  // Wrong shape.
  tensor::FlatModel shape = Filled([](size_t) { return 0.1f; },
                                   *tensor::ModelLayout::Create({{"conv1.weight", {16, 1, 5, 5}},
                                                                 {"conv1.bias", {17}},
                                                                 {"fc.weight", {320, 1000}},
                                                                 {"fc.bias", {320}}}));
  auto s = Push(Meta("bad", 1), shape).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("conv1.bias"));
  // Wrong dtype.
  auto dtype = frames_of(good);
  dtype[0].mutable_header()->set_dtype(common::v1::DTYPE_UNSPECIFIED);
  s = PushFrames(Meta("bad", 1), dtype);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dtype"));
  // Wrong size: a header whose size_bytes disagrees with its shape.
  auto size = frames_of(good);
  size[0].mutable_header()->set_size_bytes(size[0].header().size_bytes() + 4);
  s = PushFrames(Meta("bad", 1), size);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("size_bytes"));
  // Wrong size: the payload is cut short.
  auto cut = frames_of(good);
  cut.back().mutable_chunk()->resize(100);
  s = PushFrames(Meta("bad", 1), cut);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("fc.bias"));
  // NaN.
  tensor::FlatModel nan = good;
  nan.values[nan.layout.offset(2) + 12345] = std::numeric_limits<float>::quiet_NaN();
  s = Push(Meta("bad", 1), nan).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("fc.weight"));
  // Norm too large.
  tensor::FlatModel big = Filled([](size_t) { return 10.0f; });
  s = Push(Meta("bad", 1), big).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("norm"));
  // Unknown task.
  EXPECT_EQ(Push(Meta("bad", 1, "nope"), good).status().code(), absl::StatusCode::kNotFound);
  // Peer not expected.
  EXPECT_EQ(Push(Meta("stranger", 1), good).status().code(), absl::StatusCode::kFailedPrecondition);
  // Update trained from another version.
  EXPECT_EQ(Push(Meta("bad", 1, "t", 1, 5), good).status().code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(Push(Meta("good", 10), good).ok());
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok());
  EXPECT_THAT(closed->contributors(), ElementsAre("good"));
  // Closed round.
  EXPECT_EQ(Push(Meta("bad", 1), good).status().code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "malformed"), 3);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "incomplete"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "non_finite"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "norm_bound"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "unknown_task"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "unexpected_peer"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "stale_base"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "round_not_open"), 1);
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total"), 10);
  EXPECT_EQ(Metric("shoal_aggregator_updates_accepted_total"), 1);
  // The accepted push gives its staging slot back when its executor task ends, just after the
  // fold that CloseRound waited for: the gauge reaches 0 then, not necessarily before Close.
  EXPECT_TRUE(shoal::testing::WaitUntil(
      [&] { return Metric("shoal_aggregator_pushes_in_flight") == 0; }, absl::Seconds(10)))
      << Metric("shoal_aggregator_pushes_in_flight");

  // Only the good delta was applied.
  auto got = Get("t");
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < got->model.values.size(); ++i) {
    ASSERT_FLOAT_EQ(got->model.values[i], 1.5f) << i;
  }
}

// Compressed updates (top-k with int8 values, fp16) travel over the real server, are decoded
// and checked there, and aggregate exactly as their decoded values; a corrupt sparse index is
// refused with INVALID_ARGUMENT naming the tensor.
TEST_F(AggregatorServiceTest, CompressedUpdatesAggregateAsTheirDecodedValues) {
  auto channel = rpc::MakeChannel(server_->address());
  const tensor::FlatModel base = Filled([](size_t i) { return 0.125f * (i % 5); });
  ASSERT_TRUE(Put("c", 0, base).ok());
  ASSERT_TRUE(Open("c", 1, 0, {"topk", "half", "bad"}).ok());
  const auto update = [](float scale) {
    return std::make_shared<tensor::FlatModel>(
        Filled([scale](size_t i) { return scale * std::sin(0.37f * static_cast<float>(i)); }));
  };
  tensor::Compressor topk({common::v1::ENCODING_SPARSE, 0.01, common::v1::ENCODING_INT8});
  tensor::Compressor half({common::v1::ENCODING_FP16});
  auto sparse = topk.Compress(update(0.01f), 1);
  auto fp16 = half.Compress(update(-0.02f), 1);
  EXPECT_LT(sparse->payload_bytes() * 50, sparse->layout.total_bytes());
  for (const auto& [peer, encoded] : {std::pair{"topk", sparse}, std::pair{"half", fp16}}) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    auto pushed = rpc::PushUpdateZeroCopy(*channel, ctx, Meta(peer, 1, "c"), encoded);
    ASSERT_TRUE(pushed.ok()) << peer << ": " << pushed.status();
  }
  {
    // The same sparse update with its second index's gap set to 0 (a repeated index).
    auto bad = std::make_shared<tensor::EncodedModel>();
    bad->layout = sparse->layout;
    bad->encodings = sparse->encodings;
    for (absl::string_view p : sparse->payloads) bad->storage.emplace_back(p);
    const size_t t = 2;  // fc.weight
    ASSERT_EQ(bad->encodings[t].encoding, common::v1::ENCODING_SPARSE);
    size_t second = 0;
    while (static_cast<uint8_t>(bad->storage[t][second]) & 0x80) ++second;
    bad->storage[t][second + 1] = '\0';
    for (const std::string& p : bad->storage) bad->payloads.emplace_back(p);
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    auto refused = rpc::PushUpdateZeroCopy(*channel, ctx, Meta("bad", 1, "c"), bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(refused.status().message(), HasSubstr("fc.weight"));
  }
  auto closed = Close("c", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors(), ElementsAre("half", "topk"));
  auto got = Get("c");
  ASSERT_TRUE(got.ok());
  auto s = tensor::DecodeModel(*sparse);
  auto h = tensor::DecodeModel(*fp16);
  ASSERT_TRUE(s.ok() && h.ok());
  for (size_t i = 0; i < got->model.values.size(); ++i) {
    const float want = base.values[i] + (1 * s->values[i] + 1 * h->values[i]) / 2;
    ASSERT_FLOAT_EQ(got->model.values[i], want) << i;
  }
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "malformed"), 1);
}

TEST_F(AggregatorServiceTest, ZeroCopyClientPathMatchesTheProtobufPath) {
  auto channel = rpc::MakeChannel(server_->address());
  auto base =
      std::make_shared<const tensor::FlatModel>(Filled([](size_t i) { return 0.25f * (i % 7); }));
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::PutModelRequest first;
    *first.mutable_meta() = tensor::MakeModelMeta("t", 0, *base);
    auto put = rpc::PutModelZeroCopy(*channel, ctx, first, tensor::EncodeRaw(base));
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(put->digest_xxh3(), base->Digest());
  }
  ASSERT_TRUE(Open("t", 1, 0, {"zc", "pb", "bad"}).ok());
  auto d1 = std::make_shared<const tensor::FlatModel>(Filled([](size_t i) { return 0.001f * i; }));
  tensor::FlatModel d2 = Filled([](size_t i) { return -0.5f; });
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    auto pushed = rpc::PushUpdateZeroCopy(*channel, ctx, Meta("zc", 2), tensor::EncodeRaw(d1));
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_FALSE(pushed->duplicate());
  }
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    auto again = rpc::PushUpdateZeroCopy(*channel, ctx, Meta("zc", 2), tensor::EncodeRaw(d1));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->duplicate());
  }
  {
    auto nan = std::make_shared<tensor::FlatModel>(*d1);
    nan->values[nan->layout.offset(2) + 99] = std::numeric_limits<float>::infinity();
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    auto bad = rpc::PushUpdateZeroCopy(*channel, ctx, Meta("bad", 2), tensor::EncodeRaw(nan));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("fc.weight"));
  }
  ASSERT_TRUE(Push(Meta("pb", 6), d2).ok());
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok());
  EXPECT_THAT(closed->contributors(), ElementsAre("pb", "zc"));
  auto got = Get("t");
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < got->model.values.size(); ++i) {
    const float want = base->values[i] + (2 * d1->values[i] + 6 * d2.values[i]) / 8;
    ASSERT_FLOAT_EQ(got->model.values[i], want) << i;
  }
  EXPECT_EQ(Metric("shoal_aggregator_updates_rejected_total", "non_finite"), 1);

  // GetModel is served raw (chunks are slices of the model's memory); the raw reader peers use
  // and the generated stub's reader get the same model, digests checked.
  auto raw_get = [&](const std::string& task) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::GetModelRequest request;
    request.set_task(task);
    auto reader = rpc::OpenRawReader(*channel, "/shoal.aggregator.v1.AggregatorService/GetModel",
                                     ctx, request);
    return rpc::ReadModelStream(*reader, {}, &ctx);
  };
  auto raw = raw_get("t");
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->meta.version(), 1u);
  EXPECT_EQ(raw->model.layout, got->model.layout);
  EXPECT_EQ(raw->model.values, got->model.values);
  EXPECT_EQ(raw_get("nope").status().code(), absl::StatusCode::kNotFound);

  // A peer's download (GetModelInto) hands the values on as they arrive: the same model.
  aggregator::GrpcAggregatorClient client;
  std::vector<float> into(got->model.values.size(), -1.0f);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto layout = client.GetModelInto(
      server_->address(), "t", 1, {}, deadline,
      [&](size_t first, absl::Span<const float> values) {
        EXPECT_LE(first + values.size(), into.size());
        std::copy(values.begin(), values.end(), into.begin() + first);
        return absl::OkStatus();
      },
      /*held=*/nullptr);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->layout, got->model.layout);
  EXPECT_EQ(into, got->model.values);
  // The writer's error ends the download and is the call's error, naming the aggregator.
  auto refused = client.GetModelInto(
      server_->address(), "t", 1, {}, deadline,
      [](size_t, absl::Span<const float>) { return absl::ResourceExhaustedError("disk full"); },
      /*held=*/nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr(server_->address()));
}

// The service answers a push once it is accepted and folds it afterwards; a CloseRound sent
// right after the answer must still count it, exactly once, in that round's model.
TEST_F(AggregatorServiceTest, PushAcknowledgedJustBeforeCloseRoundIsInItsAggregate) {
  // ~40 MB, so that the fold after the answer takes long enough to race with CloseRound.
  const tensor::ModelLayout layout =
      *tensor::ModelLayout::Create({{"a", {5000, 1000}}, {"b", {5000, 1000}}});
  auto channel = rpc::MakeChannel(server_->address());
  tensor::FlatModel model = Filled([](size_t i) { return 0.5f * (i % 5); }, layout);
  ASSERT_TRUE(Put("t", 0, model).ok());
  for (uint64_t round = 1; round <= 4; ++round) {
    ASSERT_TRUE(Open("t", round, round - 1, {"p", "q"}).ok());
    auto delta = std::make_shared<const tensor::FlatModel>(
        Filled([round](size_t i) { return 0.25f * round + 0.001f * (i % 3); }, layout));
    tensor::FlatModel other = Filled([](size_t i) { return -1.0f; }, layout);
    ASSERT_TRUE(Push(Meta("q", 3, "t", round, round - 1), other).ok());
    {
      grpc::ClientContext ctx;
      rpc::SetTimeout(ctx, absl::Seconds(30));
      auto pushed = rpc::PushUpdateZeroCopy(*channel, ctx, Meta("p", 1, "t", round, round - 1),
                                            tensor::EncodeRaw(delta));
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_FALSE(pushed->duplicate());
    }
    auto closed = Close("t", round);
    ASSERT_TRUE(closed.ok()) << closed.status();
    EXPECT_EQ(closed->version(), round);
    EXPECT_THAT(closed->contributors(), ElementsAre("p", "q"));
    EXPECT_EQ(closed->num_samples(), 4u);
    auto got = Get("t");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->model.Digest(), closed->digest_xxh3());
    for (size_t i = 0; i < model.values.size(); ++i) {
      const float want = model.values[i] + (1 * delta->values[i] + 3 * other.values[i]) / 4;
      ASSERT_FLOAT_EQ(got->model.values[i], want) << "round " << round << ", value " << i;
    }
    model = std::move(got->model);
  }
  EXPECT_EQ(Metric("shoal_aggregator_updates_accepted_total"), 8);
}

TEST_F(AggregatorServiceTest, ControlCallErrors) {
  EXPECT_EQ(Open("nope", 1, 0, {"a"}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Close("nope", 1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Put("t", 2, Filled([](size_t) { return 1.0f; })).ok());
  EXPECT_EQ(Open("t", 1, 0, {"a"}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Put("t", 1, Filled([](size_t) { return 1.0f; })).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A model stream that is cut short is refused and stores nothing.
  grpc::ClientContext ctx;
  rpc::SetTimeout(ctx, absl::Seconds(10));
  aggregator::v1::PutModelResponse response;
  auto writer = stub_->PutModel(&ctx, &response);
  tensor::FlatModel m = Filled([](size_t) { return 3.0f; });
  aggregator::v1::PutModelRequest request;
  *request.mutable_meta() = tensor::MakeModelMeta("u", 0, m);
  ASSERT_TRUE(writer->Write(request));
  tensor::FrameEncoder enc(m);
  ASSERT_TRUE(enc.Next(request.mutable_frame()));
  ASSERT_TRUE(writer->Write(request));
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Get("u").status().code(), absl::StatusCode::kNotFound);
  // Release forgets the task.
  grpc::ClientContext rctx;
  rpc::SetTimeout(rctx, absl::Seconds(10));
  aggregator::v1::ReleaseTaskRequest release;
  release.set_task("t");
  aggregator::v1::ReleaseTaskResponse released;
  ASSERT_TRUE(stub_->ReleaseTask(&rctx, release, &released).ok());
  EXPECT_TRUE(released.has_newest_version());
  EXPECT_EQ(Get("t").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shoal::aggregator
