// RelayHub: which peer keeps which relay stream, and the calls in flight on each (fake streams).

#include "services/aggregator/relay_hub.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::aggregator {
namespace {

using ::testing::HasSubstr;

class FakeStream : public RelayHub::Stream {
 public:
  void Send(const peer::v1::RelayCall& call) override { sent.push_back(call); }
  void Close(const absl::Status& status) override { closed = status; }
  std::vector<peer::v1::RelayCall> sent;
  std::optional<absl::Status> closed;
};

peer::v1::RelayCall Snapshot() {
  peer::v1::RelayCall call;
  call.mutable_get_snapshot()->set_task("t1");
  call.mutable_get_snapshot()->set_round(3);
  return call;
}

peer::v1::RelayCall Probe() {
  peer::v1::RelayCall call;
  call.mutable_probe()->set_task("t1");
  return call;
}

peer::v1::RelayReply Chunk(uint64_t call_id, std::string bytes) {
  peer::v1::RelayReply reply;
  reply.set_call_id(call_id);
  reply.set_chunk(std::move(bytes));
  return reply;
}

peer::v1::RelayReply End(uint64_t call_id, absl::StatusCode code, std::string message = "") {
  peer::v1::RelayReply reply;
  reply.set_call_id(call_id);
  reply.mutable_end()->set_code(static_cast<int>(code));
  reply.mutable_end()->set_message(std::move(message));
  return reply;
}

class RelayHubTest : public ::testing::Test {
 protected:
  RelayHub::Options options_;
  prometheus::Registry registry_;
  AggregatorMetrics metrics_{registry_};
};

TEST_F(RelayHubTest, PassesACallDownThePeersStreamAndItsAnswerBack) {
  RelayHub hub(options_, metrics_);
  auto stream = std::make_shared<FakeStream>();
  const uint64_t token = hub.Attach("peer-n", stream);
  ASSERT_EQ(stream->sent.size(), 1u);
  EXPECT_EQ(stream->sent[0].call_id(), 0u);  // attached
  EXPECT_EQ(metrics_.relay_streams.Value(), 1);

  std::optional<RelayResult> got;
  std::vector<std::string> chunks;
  const uint64_t id = hub.Call(
      "peer-n", Snapshot(), [&](RelayResult r) { got = std::move(r); },
      [&](std::string chunk) { chunks.push_back(std::move(chunk)); });
  ASSERT_EQ(stream->sent.size(), 2u);
  EXPECT_EQ(stream->sent[1].call_id(), id);
  EXPECT_EQ(stream->sent[1].get_snapshot().round(), 3u);
  // Each chunk goes on as it comes.
  ASSERT_TRUE(hub.OnReply(token, Chunk(id, "meta")).ok());
  EXPECT_THAT(chunks, ::testing::ElementsAre("meta"));
  ASSERT_TRUE(hub.OnReply(token, Chunk(id, "frame")).ok());
  EXPECT_THAT(chunks, ::testing::ElementsAre("meta", "frame"));
  EXPECT_FALSE(got.has_value());
  ASSERT_TRUE(hub.OnReply(token, End(id, absl::StatusCode::kOk)).ok());
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->status.ok()) << got->status;
  EXPECT_EQ(got->bytes, 9u);
  EXPECT_EQ(metrics_.relay_bytes.Value(), 9);
  EXPECT_EQ(metrics_.relay_calls_relayed.Value(), 1);

  // The peer's own error comes back as it gave it; a probe's answer too.
  got.reset();
  const uint64_t failing = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { got = r; });
  ASSERT_TRUE(hub.OnReply(token, End(failing, absl::StatusCode::kNotFound, "no round 3")).ok());
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(absl::IsNotFound(got->status)) << got->status;
  EXPECT_EQ(got->status.message(), "no round 3");
  got.reset();
  const uint64_t probe = hub.Call("peer-n", Probe(), [&](RelayResult r) { got = r; });
  peer::v1::RelayReply answer;
  answer.set_call_id(probe);
  answer.mutable_probe()->set_peer_id("peer-n");
  ASSERT_TRUE(hub.OnReply(token, answer).ok());
  ASSERT_TRUE(got.has_value() && got->status.ok());
  EXPECT_EQ(got->probe.peer_id(), "peer-n");
}

TEST_F(RelayHubTest, RefusesCallsForPeersWithoutAStreamAndFailsCallsWhenTheStreamEnds) {
  RelayHub hub(options_, metrics_);
  std::optional<RelayResult> got;
  hub.Call("nobody", Snapshot(), [&](RelayResult r) { got = r; });
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(absl::IsNotFound(got->status)) << got->status;
  EXPECT_THAT(got->status.message(), HasSubstr("peer 'nobody' keeps no relay stream"));
  EXPECT_EQ(metrics_.relay_calls_no_stream.Value(), 1);

  auto stream = std::make_shared<FakeStream>();
  const uint64_t token = hub.Attach("peer-n", stream);
  got.reset();
  hub.Call("peer-n", Snapshot(), [&](RelayResult r) { got = r; });
  hub.Detach(token);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(absl::IsUnavailable(got->status)) << got->status;
  EXPECT_EQ(hub.streams(), 0u);
  EXPECT_EQ(metrics_.relay_streams.Value(), 0);
  got.reset();
  hub.Call("peer-n", Snapshot(), [&](RelayResult r) { got = r; });
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(absl::IsNotFound(got->status)) << got->status;
}

TEST_F(RelayHubTest, ANewerStreamReplacesTheOlderOne) {
  RelayHub hub(options_, metrics_);
  auto first = std::make_shared<FakeStream>();
  auto second = std::make_shared<FakeStream>();
  const uint64_t old_token = hub.Attach("peer-n", first);
  std::optional<RelayResult> got;
  hub.Call("peer-n", Snapshot(), [&](RelayResult r) { got = r; });
  const uint64_t token = hub.Attach("peer-n", second);
  ASSERT_TRUE(first->closed.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*first->closed));
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(absl::IsUnavailable(got->status)) << got->status;
  EXPECT_EQ(hub.streams(), 1u);
  // The old stream's end does not detach the new one.
  hub.Detach(old_token);
  got.reset();
  const uint64_t id = hub.Call("peer-n", Probe(), [&](RelayResult r) { got = r; });
  EXPECT_EQ(second->sent.back().call_id(), id);
  peer::v1::RelayReply answer;
  answer.set_call_id(id);
  answer.mutable_probe();
  // A reply on the wrong stream is a protocol error.
  EXPECT_TRUE(absl::IsInvalidArgument(hub.OnReply(old_token, answer)));
  ASSERT_TRUE(hub.OnReply(token, answer).ok());
  EXPECT_TRUE(got.has_value() && got->status.ok());
}

// A caller that asks again the moment its call fails (as the coordinator's dial-back does) sends
// its call down the newer stream: after that stream's call 0, which the peer reads as the
// attachment. Before the fix the retry went first, and the peer took no attachment and dropped
// the call (the coordinator saw the peer unreachable).
TEST_F(RelayHubTest, TheAttachmentGoesDownANewStreamBeforeAnyCall) {
  RelayHub hub(options_, metrics_);
  auto first = std::make_shared<FakeStream>();
  auto second = std::make_shared<FakeStream>();
  hub.Attach("peer-n", first);
  std::optional<RelayResult> retried;
  hub.Call("peer-n", Probe(), [&](RelayResult failed) {
    EXPECT_TRUE(absl::IsUnavailable(failed.status)) << failed.status;
    hub.Call("peer-n", Probe(), [&](RelayResult r) { retried = r; });
  });
  hub.Attach("peer-n", second);
  ASSERT_EQ(second->sent.size(), 2u);
  EXPECT_EQ(second->sent[0].call_id(), 0u);
  EXPECT_FALSE(second->sent[0].has_probe());
  EXPECT_NE(second->sent[1].call_id(), 0u);
  EXPECT_TRUE(second->sent[1].has_probe());
  EXPECT_FALSE(retried.has_value());  // in flight on the new stream
}

// A call made while a new stream's attachment is being sent (by another thread; here from within
// the send) finds the stream and follows the attachment down it. A stream listed only after its
// attachment was sent left a peer that had read it unreachable for that moment.
TEST_F(RelayHubTest, ACallMadeWhileTheAttachmentIsSentFollowsIt) {
  RelayHub hub(options_, metrics_);
  struct CallingStream : FakeStream {
    std::function<void()> on_first_send;
    void Send(const peer::v1::RelayCall& call) override {
      FakeStream::Send(call);
      if (std::function<void()> f = std::exchange(on_first_send, nullptr)) f();
    }
  };
  auto stream = std::make_shared<CallingStream>();
  std::optional<RelayResult> answered;
  stream->on_first_send = [&] {
    hub.Call("peer-h", Snapshot(), [&](RelayResult r) { answered = r; });
  };
  hub.Attach("peer-h", stream);
  ASSERT_EQ(stream->sent.size(), 2u);
  EXPECT_EQ(stream->sent[0].call_id(), 0u);
  EXPECT_TRUE(stream->sent[1].has_get_snapshot());
  EXPECT_NE(stream->sent[1].call_id(), 0u);
  EXPECT_FALSE(answered.has_value()) << "in flight, not refused: " << answered->status;
}

TEST_F(RelayHubTest, BoundsCallsPerPeerAndWhatTheRelayHoldsOfASnapshot) {
  options_.max_calls_per_peer = 2;
  options_.max_call_bytes = 10;
  RelayHub hub(options_, metrics_);
  auto stream = std::make_shared<FakeStream>();
  const uint64_t token = hub.Attach("peer-n", stream);
  std::vector<RelayResult> results;
  auto keep = [&](RelayResult r) { results.push_back(std::move(r)); };
  const uint64_t a = hub.Call("peer-n", Snapshot(), keep);
  hub.Call("peer-n", Snapshot(), keep);
  hub.Call("peer-n", Snapshot(), keep);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(absl::IsResourceExhausted(results[0].status)) << results[0].status;
  EXPECT_THAT(results[0].status.message(), HasSubstr("2 relayed calls in flight"));

  ASSERT_TRUE(hub.OnReply(token, Chunk(a, "123456")).ok());
  ASSERT_TRUE(hub.OnReply(token, Chunk(a, "7890123")).ok());  // 13 bytes held > 10
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(absl::IsResourceExhausted(results[1].status)) << results[1].status;
  EXPECT_THAT(results[1].status.message(), HasSubstr("the caller has not taken yet"));
  // The rest of that snapshot is dropped; the freed slot takes a new call.
  EXPECT_TRUE(hub.OnReply(token, End(a, absl::StatusCode::kOk)).ok());
  EXPECT_EQ(results.size(), 2u);
  const uint64_t b = hub.Call("peer-n", Snapshot(), keep);
  EXPECT_EQ(results.size(), 2u);

  // A caller that sends each chunk on as it comes relays any size: only what it has not sent
  // counts.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(hub.OnReply(token, Chunk(b, "12345678")).ok());
    hub.Sent(b, 8);
  }
  ASSERT_TRUE(hub.OnReply(token, End(b, absl::StatusCode::kOk)).ok());
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[2].status.ok()) << results[2].status;
  EXPECT_EQ(results[2].bytes, 40u);
  hub.Abandon(b);
}

TEST_F(RelayHubTest, BoundsTheBytesOfAllSnapshotsInFlight) {
  options_.max_call_bytes = 10;
  options_.max_total_bytes = 12;
  RelayHub hub(options_, metrics_);
  auto stream = std::make_shared<FakeStream>();
  const uint64_t token = hub.Attach("peer-n", stream);
  std::map<uint64_t, RelayResult> results;
  const uint64_t a = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { results[1] = r; });
  const uint64_t b = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { results[2] = r; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(a, "123456")).ok());
  ASSERT_TRUE(hub.OnReply(token, Chunk(b, "123456")).ok());  // 12 in flight: at the limit
  ASSERT_TRUE(hub.OnReply(token, Chunk(a, "7")).ok());       // 13: over it
  ASSERT_EQ(results.count(1), 1u);
  EXPECT_TRUE(absl::IsResourceExhausted(results[1].status)) << results[1].status;
  EXPECT_THAT(results[1].status.message(), HasSubstr("holds 12 bytes of snapshots in flight"));
  ASSERT_TRUE(hub.OnReply(token, End(b, absl::StatusCode::kOk)).ok());
  ASSERT_EQ(results.count(2), 1u);
  EXPECT_TRUE(results[2].status.ok()) << results[2].status;
  // b's 6 bytes are held until its caller has sent them on (or lets the call go).
  const uint64_t held = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { results[6] = r; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(held, "1234567")).ok());  // 6 + 7 > 12
  ASSERT_EQ(results.count(6), 1u);
  EXPECT_TRUE(absl::IsResourceExhausted(results[6].status)) << results[6].status;
  hub.Sent(b, 4);
  EXPECT_FALSE(hub.Abandon(b));  // answered: only its bytes come back
  EXPECT_FALSE(hub.Abandon(b));  // idempotent
  // Everything was given back: a new call may hold up to its own limit.
  const uint64_t c = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { results[3] = r; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(c, "1234567890")).ok());
  ASSERT_TRUE(hub.OnReply(token, End(c, absl::StatusCode::kOk)).ok());
  EXPECT_TRUE(results[3].status.ok()) << results[3].status;
  hub.Abandon(c);
  // An abandoned call gives its bytes back too.
  const uint64_t d = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { results[4] = r; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(d, "1234567890")).ok());
  EXPECT_TRUE(hub.Abandon(d));
  const uint64_t e = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { results[5] = r; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(e, "1234567890")).ok());
  ASSERT_TRUE(hub.OnReply(token, End(e, absl::StatusCode::kOk)).ok());
  EXPECT_TRUE(results[5].status.ok()) << results[5].status;
  EXPECT_EQ(results.count(4), 0u);
}

// A caller that goes away in the middle of a snapshot abandons the call: the rest of the
// peer's chunks are dropped, not held, and the relay's budget is whole again.
TEST_F(RelayHubTest, ACallerGoneMidSnapshotLeavesNothingHeld) {
  options_.max_total_bytes = 10;
  RelayHub hub(options_, metrics_);
  auto stream = std::make_shared<FakeStream>();
  const uint64_t token = hub.Attach("peer-n", stream);
  int chunks = 0;
  bool done = false;
  const uint64_t a = hub.Call(
      "peer-n", Snapshot(), [&](RelayResult) { done = true; }, [&](std::string) { ++chunks; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(a, "12345678")).ok());
  EXPECT_TRUE(hub.Abandon(a));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(hub.OnReply(token, Chunk(a, "12345678")).ok());
  ASSERT_TRUE(hub.OnReply(token, End(a, absl::StatusCode::kOk)).ok());
  EXPECT_EQ(chunks, 1);
  EXPECT_FALSE(done);
  std::optional<RelayResult> got;
  const uint64_t b = hub.Call("peer-n", Snapshot(), [&](RelayResult r) { got = r; });
  ASSERT_TRUE(hub.OnReply(token, Chunk(b, "1234567890")).ok());  // the whole budget
  ASSERT_TRUE(hub.OnReply(token, End(b, absl::StatusCode::kOk)).ok());
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->status.ok()) << got->status;
}

TEST_F(RelayHubTest, AnAbandonedCallNeverAnswersAndProtocolErrorsAreRefused) {
  RelayHub hub(options_, metrics_);
  auto stream = std::make_shared<FakeStream>();
  const uint64_t token = hub.Attach("peer-n", stream);
  bool called = false;
  const uint64_t id = hub.Call("peer-n", Snapshot(), [&](RelayResult) { called = true; });
  EXPECT_TRUE(hub.Abandon(id));
  EXPECT_FALSE(hub.Abandon(id));
  EXPECT_TRUE(hub.OnReply(token, End(id, absl::StatusCode::kOk)).ok());
  EXPECT_FALSE(called);

  const uint64_t probe = hub.Call("peer-n", Probe(), [&](RelayResult) {});
  EXPECT_THAT(hub.OnReply(token, Chunk(probe, "x")).message(), HasSubstr("a probe"));
  const uint64_t snapshot = hub.Call("peer-n", Snapshot(), [&](RelayResult) {});
  EXPECT_TRUE(absl::IsInvalidArgument(hub.OnReply(token, End(snapshot, absl::StatusCode(99)))));
  peer::v1::RelayReply empty;
  empty.set_call_id(snapshot);
  EXPECT_TRUE(absl::IsInvalidArgument(hub.OnReply(token, empty)));
}

}  // namespace
}  // namespace shoal::aggregator
