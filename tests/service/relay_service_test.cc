// Peers behind NAT: a real RelayLink (the relayed peer's side) keeps its stream open to the real
// RelayService of an in-process relay on 127.0.0.1:0, and a real GrpcPeerClient fetches and
// probes the peer at RELAY/PEER_ID (plaintext).

#include "services/aggregator/relay_service.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/server.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/relay_hub.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/relay_link.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/peer/v1/peer.grpc.pb.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/wait.h"

namespace shoal {
namespace {

using ::testing::HasSubstr;

// Plaintext, retrying every 200 ms at most.
peer::RelayLinkOptions LinkOptions(const std::string& relay, const std::string& id) {
  peer::RelayLinkOptions options;
  options.relay = relay;
  options.peer_id = id;
  options.max_backoff = absl::Milliseconds(200);
  return options;
}

tensor::ModelLayout Layout() {
  // 2.6 MB: several 1 MiB chunks.
  absl::StatusOr<tensor::ModelLayout> layout =
      tensor::ModelLayout::Create({{"fc.weight", {80000, 8}}, {"fc.bias", {8}}});
  EXPECT_TRUE(layout.ok());
  return *layout;
}

class RelayServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    aggregator_metrics_ = std::make_unique<aggregator::AggregatorMetrics>(relay_registry_);
    hub_ = std::make_unique<aggregator::RelayHub>(aggregator::RelayHub::Options{},
                                                  *aggregator_metrics_);
    relay_service_ = std::make_unique<aggregator::RelayServiceImpl>(*hub_);
    relay_peer_service_ = std::make_unique<aggregator::RelayPeerServiceImpl>(*hub_);
    rpc::ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.service_name = "relay-test";
    auto server = rpc::Server::Start(options, {relay_service_.get(), relay_peer_service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    peer_metrics_ = std::make_unique<peer::PeerMetrics>(peer_registry_);
    client_ = std::make_unique<peer::GrpcPeerClient>(nullptr, peer_metrics_.get());
  }
  void TearDown() override {
    link_.reset();
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(2));
  }

  void Link(const std::string& id) {
    link_ = std::make_unique<peer::RelayLink>(LinkOptions(server_->address(), id), store_,
                                              *peer_metrics_);
    absl::Status s = link_->WaitAttached(absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(s.ok()) << s;
  }

  std::shared_ptr<const tensor::FlatModel> Publish(uint64_t round) {
    auto m = std::make_shared<tensor::FlatModel>();
    m->layout = Layout();
    m->values.resize(m->layout.total_elements());
    for (size_t i = 0; i < m->values.size(); ++i) m->values[i] = 0.001f * (i % 1000) + round;
    peer::Snapshot s;
    s.task = "t1";
    s.version = round;
    s.model = m;
    s.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
    s.round = round;
    s.num_samples = 640;
    store_.Publish(std::move(s));
    return m;
  }

  static peer::v1::GetSnapshotRequest Request(uint64_t round) {
    peer::v1::GetSnapshotRequest r;
    r.set_task("t1");
    r.set_kind(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
    r.set_round(round);
    r.set_peer_id("peer-c");
    return r;
  }
  absl::StatusOr<tensor::ReceivedModel> Fetch(const std::string& address, uint64_t round) {
    return client_->Fetch(address, Request(round), absl::Now() + absl::Seconds(20), Layout());
  }
  std::string At(const std::string& peer) { return server_->address() + "/" + peer; }

  prometheus::Registry relay_registry_;
  prometheus::Registry peer_registry_;
  std::unique_ptr<aggregator::AggregatorMetrics> aggregator_metrics_;
  std::unique_ptr<aggregator::RelayHub> hub_;
  std::unique_ptr<aggregator::RelayServiceImpl> relay_service_;
  std::unique_ptr<aggregator::RelayPeerServiceImpl> relay_peer_service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<peer::PeerMetrics> peer_metrics_;
  std::unique_ptr<peer::GrpcPeerClient> client_;
  peer::SnapshotStore store_;
  std::unique_ptr<peer::RelayLink> link_;  // after store_: stops before it goes
};

TEST_F(RelayServiceTest, OtherPeersFetchAndProbeARelayedPeerAtRelaySlashId) {
  Link("peer-n");
  auto model = Publish(3);
  absl::StatusOr<tensor::ReceivedModel> got = Fetch(At("peer-n"), 3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.task(), "t1");
  EXPECT_EQ(got->meta.version(), 3u);
  EXPECT_EQ(got->meta.num_samples(), 640u);
  EXPECT_EQ(got->model.Digest(), model->Digest());
  EXPECT_GT(aggregator_metrics_->relay_bytes.Value(), static_cast<double>(Layout().total_bytes()));
  EXPECT_EQ(aggregator_metrics_->relay_calls_relayed.Value(), 1);
  EXPECT_EQ(peer_metrics_->snapshots_served.Value(), 1);

  // The peer's own refusal comes through: another round is FAILED_PRECONDITION.
  absl::Status s = Fetch(At("peer-n"), 4).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(At("peer-n")));

  peer::v1::ProbeRequest probe;
  probe.set_task("t1");
  probe.set_peer_id("peer-c");
  s = client_->Probe(At("peer-n"), probe, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(RelayServiceTest, CallsForPeersWithoutAStreamOrWithoutAPeerAreRefused) {
  Link("peer-n");
  Publish(3);
  absl::Status s = Fetch(At("peer-x"), 3).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("peer 'peer-x' keeps no relay stream at this aggregator"));
  s = Fetch(server_->address(), 3).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("relay_to must name the peer"));
  peer::v1::ProbeRequest probe;
  s = client_->Probe(server_->address(), probe, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(aggregator_metrics_->relay_calls_no_stream.Value(), 1);
}

TEST_F(RelayServiceTest, APeerThatGoesAwayIsNotFoundAndReachableAgainOnceItReconnects) {
  Link("peer-n");
  auto model = Publish(5);
  ASSERT_TRUE(Fetch(At("peer-n"), 5).ok());
  link_.reset();
  ASSERT_TRUE(testing::WaitUntil([&] { return hub_->streams() == 0; }, absl::Seconds(20)));
  absl::Status s = Fetch(At("peer-n"), 5).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(aggregator_metrics_->relay_streams.Value(), 0);

  Link("peer-n");
  absl::StatusOr<tensor::ReceivedModel> got = Fetch(At("peer-n"), 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->model.Digest(), model->Digest());
}

TEST_F(RelayServiceTest, ALinkWaitsForItsRelayAndAttachesWhenItComes) {
  // A relay that is not there yet: WaitAttached times out naming it; the link keeps trying.
  const std::string address = server_->address();
  // Held while the relay is down, so that no test running beside this one is handed the port.
  absl::StatusOr<testing::ReservedPort> held =
      testing::ReservedPort::Reserve(std::stoi(address.substr(address.rfind(':') + 1)));
  ASSERT_TRUE(held.ok()) << held.status();
  server_->Shutdown(absl::Seconds(2));
  server_.reset();
  link_ = std::make_unique<peer::RelayLink>(LinkOptions(address, "peer-n"), store_, *peer_metrics_);
  absl::Status s = link_->WaitAttached(absl::Now() + absl::Milliseconds(500));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(address));

  rpc::ServerOptions options;
  options.listen = address;
  options.service_name = "relay-test";
  auto server = rpc::Server::Start(options, {relay_service_.get(), relay_peer_service_.get()});
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  s = link_->WaitAttached(absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(s.ok()) << s;
  auto model = Publish(1);
  absl::StatusOr<tensor::ReceivedModel> got = Fetch(At("peer-n"), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->model.Digest(), model->Digest());
}

// A peer played by hand on a raw Relay stream: the caller receives the snapshot's first chunk
// while the peer has not sent the rest, so the relay passes chunks on as they come instead of
// storing the snapshot whole.
TEST_F(RelayServiceTest, ASnapshotGoesOnChunkByChunkBeforeThePeerHasSentItAll) {
  std::shared_ptr<grpc::Channel> channel = rpc::MakeChannel(server_->address());
  auto relay = peer::v1::RelayService::NewStub(channel);
  grpc::ClientContext peer_context;
  peer_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = relay->Relay(&peer_context);
  peer::v1::RelayReply open;
  open.mutable_open()->set_peer_id("peer-h");
  ASSERT_TRUE(stream->Write(open));
  peer::v1::RelayCall call;
  ASSERT_TRUE(stream->Read(&call));
  ASSERT_EQ(call.call_id(), 0u);  // attached

  auto peers = peer::v1::PeerService::NewStub(channel);
  grpc::ClientContext caller_context;
  caller_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  peer::v1::GetSnapshotRequest request = Request(4);
  request.set_relay_to("peer-h");
  auto reader = peers->GetSnapshot(&caller_context, request);
  ASSERT_TRUE(stream->Read(&call));
  ASSERT_TRUE(call.has_get_snapshot());
  EXPECT_EQ(call.get_snapshot().round(), 4u);
  EXPECT_TRUE(call.get_snapshot().relay_to().empty());

  common::v1::ModelChunk meta;
  meta.mutable_meta()->set_task("t1");
  meta.mutable_meta()->set_version(4);
  peer::v1::RelayReply reply;
  reply.set_call_id(call.call_id());
  reply.set_chunk(meta.SerializeAsString());
  ASSERT_TRUE(stream->Write(reply));
  common::v1::ModelChunk got;
  ASSERT_TRUE(reader->Read(&got)) << "the first chunk did not come before the snapshot's end";
  EXPECT_EQ(got.meta().version(), 4u);

  peer::v1::RelayReply end;
  end.set_call_id(call.call_id());
  end.mutable_end()->set_code(0);
  ASSERT_TRUE(stream->Write(end));
  EXPECT_FALSE(reader->Read(&got));
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(aggregator_metrics_->relay_bytes.Value(), static_cast<double>(reply.chunk().size()));

  stream->WritesDone();
  while (stream->Read(&call)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace shoal
