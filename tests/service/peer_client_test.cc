// GrpcPeerClient against a real in-process PeerService on 127.0.0.1:0 (plaintext).

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/metrics/metrics_server.h"
#include "libs/rpc/pacer.h"
#include "libs/rpc/server.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/snapshot_store.h"
#include "tests/testing/reserved_port.h"

namespace shoal::peer {
namespace {

using ::testing::HasSubstr;

tensor::ModelLayout Layout(int64_t rows) {
  absl::StatusOr<tensor::ModelLayout> layout =
      tensor::ModelLayout::Create({{"fc.weight", {rows, 8}}, {"fc.bias", {rows}}});
  EXPECT_TRUE(layout.ok());
  return *layout;
}

std::shared_ptr<const tensor::FlatModel> Model(const tensor::ModelLayout& layout, float base) {
  auto m = std::make_shared<tensor::FlatModel>();
  m->layout = layout;
  m->values.resize(layout.total_elements());
  for (size_t i = 0; i < m->values.size(); ++i) m->values[i] = base + 0.001f * i;
  return m;
}

class PeerClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metrics_ = std::make_unique<PeerMetrics>(registry_);
    client_ = std::make_unique<GrpcPeerClient>(nullptr, metrics_.get());
  }

  // Starts a PeerService over `store_` on 127.0.0.1:0.
  std::unique_ptr<rpc::Server> Serve(std::unique_ptr<PeerServiceImpl>& service,
                                     rpc::Pacer* pacer = nullptr) {
    PeerServiceOptions options;
    options.peer_id = [] { return std::string("peer-s"); };
    options.pacer = pacer;
    service = std::make_unique<PeerServiceImpl>(store_, *metrics_, options);
    rpc::ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    server_options.service_name = "peer-client-test";
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start(server_options, {service.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    return *std::move(server);
  }

  void PublishUpdate(uint64_t round, std::shared_ptr<const tensor::FlatModel> model,
                     uint64_t samples) {
    Snapshot s;
    s.task = "t1";
    s.version = round;
    s.model = std::move(model);
    s.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
    s.round = round;
    s.num_samples = samples;
    store_.Publish(std::move(s));
  }

  static peer::v1::GetSnapshotRequest Request(peer::v1::SnapshotKind kind, uint64_t round) {
    peer::v1::GetSnapshotRequest r;
    r.set_task("t1");
    r.set_kind(kind);
    r.set_round(round);
    r.set_peer_id("peer-c");
    return r;
  }

  static absl::Time Deadline() { return absl::Now() + absl::Seconds(10); }

  prometheus::Registry registry_;
  std::unique_ptr<PeerMetrics> metrics_;
  SnapshotStore store_;
  std::unique_ptr<GrpcPeerClient> client_;
};

TEST_F(PeerClientTest, FetchesTheSnapshotOfTheKindAndRoundAsked) {
  std::unique_ptr<PeerServiceImpl> service;
  std::unique_ptr<rpc::Server> server = Serve(service);
  const tensor::ModelLayout layout = Layout(16);
  auto update = Model(layout, 1.0f);
  PublishUpdate(3, update, 640);

  absl::StatusOr<tensor::ReceivedModel> got = client_->Fetch(
      server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 3), Deadline(), layout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.task(), "t1");
  EXPECT_EQ(got->meta.version(), 3u);
  EXPECT_EQ(got->meta.num_samples(), 640u);
  EXPECT_EQ(got->model.Digest(), update->Digest());
  EXPECT_EQ(metrics_->peer_bytes_pulled.Value(), static_cast<double>(layout.total_bytes()));

  // Another round: FAILED_PRECONDITION; another kind not published: NOT_FOUND; another task:
  // NOT_FOUND.
  absl::Status s = client_
                       ->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 4),
                               Deadline(), layout)
                       .status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(server->address()));
  s = client_
          ->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_GLOBAL, 3), Deadline(), layout)
          .status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  auto other_task = Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 3);
  other_task.set_task("t2");
  s = client_->Fetch(server->address(), other_task, Deadline(), layout).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;

  // Probe answers with the server's peer id.
  peer::v1::ProbeRequest probe;
  probe.set_task("t1");
  probe.set_round(3);
  probe.set_peer_id("peer-c");
  EXPECT_TRUE(client_->Probe(server->address(), probe, Deadline()).ok());
}

TEST_F(PeerClientTest, APacedSnapshotGoesOutAtThePacersRateInSmallMessages) {
  // 2 MB/s, two readers at once: their 2 x 432 KB share the rate, so the later one ends no
  // sooner than 0.43 s, less a first message of each, after the start (on loopback, unpaced,
  // both take milliseconds).
  std::atomic<double> rate{2e6};
  rpc::Pacer pacer([&rate] { return rate.load(); });
  std::unique_ptr<PeerServiceImpl> service;
  std::unique_ptr<rpc::Server> server = Serve(service, &pacer);
  const tensor::ModelLayout layout = Layout(12'000);  // 108,000 values: 432 KB
  auto update = Model(layout, 1.0f);
  PublishUpdate(2, update, 10);

  const absl::Time start = absl::Now();
  absl::StatusOr<tensor::ReceivedModel> got[2];
  std::thread other([&] {
    got[1] = client_->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 2),
                            Deadline(), layout);
  });
  got[0] = client_->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 2),
                          Deadline(), layout);
  other.join();
  const absl::Duration took = absl::Now() - start;
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->model.Digest(), update->Digest());
  }
  const double bytes = 2.0 * static_cast<double>(layout.total_bytes());
  const double first_message = 16 << 10;
  EXPECT_GE(absl::ToDoubleSeconds(took), (bytes - 2 * first_message) / rate.load())
      << "paced at " << rate.load() << " bytes/s";
  EXPECT_EQ(metrics_->serve_pacing_rate.Value(), 2e6);

  // Not paced (rate 0): the same stream as without a pacer.
  rate = 0;
  absl::StatusOr<tensor::ReceivedModel> unpaced = client_->Fetch(
      server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 2), Deadline(), layout);
  ASSERT_TRUE(unpaced.ok()) << unpaced.status();
  EXPECT_EQ(unpaced->model.Digest(), update->Digest());
  EXPECT_EQ(metrics_->serve_pacing_rate.Value(), 0);
}

TEST_F(PeerClientTest, RejectsAMismatchedLayoutAndNonFiniteValues) {
  std::unique_ptr<PeerServiceImpl> service;
  std::unique_ptr<rpc::Server> server = Serve(service);
  PublishUpdate(1, Model(Layout(16), 1.0f), 10);

  // Same tensor names, other shapes.
  absl::Status s = client_
                       ->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 1),
                               Deadline(), Layout(12))
                       .status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(metrics_->snapshots_rejected.Value(), 1);

  // Same sizes, other names.
  absl::StatusOr<tensor::ModelLayout> renamed =
      tensor::ModelLayout::Create({{"other.weight", {16, 8}}, {"fc.bias", {16}}});
  ASSERT_TRUE(renamed.ok());
  s = client_
          ->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 1), Deadline(),
                  *renamed)
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("other.weight"));

  // A NaN in the snapshot.
  auto bad = std::make_shared<tensor::FlatModel>(*Model(Layout(16), 1.0f));
  bad->values[5] = std::numeric_limits<float>::quiet_NaN();
  PublishUpdate(2, bad, 10);
  s = client_
          ->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 2), Deadline(),
                  Layout(16))
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(metrics_->snapshots_rejected.Value(), 3);
  EXPECT_EQ(metrics_->peer_bytes_pulled.Value(), 0);
}

// A peer advertised at an address where nothing listens (what shoal-peer --advertise can
// make): calls fail UNAVAILABLE or DEADLINE_EXCEEDED within their deadline, and count.
TEST_F(PeerClientTest, PeerAdvertisedWhereNothingListensIsUnreachable) {
  absl::StatusOr<shoal::testing::ReservedPort> port = shoal::testing::ReservedPort::Reserve();
  ASSERT_TRUE(port.ok()) << port.status();
  absl::Status s = client_
                       ->Fetch(port->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 1),
                               absl::Now() + absl::Seconds(3), Layout(16))
                       .status();
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  peer::v1::ProbeRequest probe;
  s = client_->Probe(port->address(), probe, absl::Now() + absl::Seconds(3));
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_GE(metrics_->peer_fetches_failed.Value(), 1);
}

TEST_F(PeerClientTest, CancelledCallerFailsAtOnce) {
  std::unique_ptr<PeerServiceImpl> service;
  std::unique_ptr<rpc::Server> server = Serve(service);
  PublishUpdate(1, Model(Layout(16), 1.0f), 10);
  CallCanceller canceller;
  canceller.Cancel();
  EXPECT_TRUE(canceller.cancelled());
  absl::Status s = client_
                       ->Fetch(server->address(), Request(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE, 1),
                               Deadline(), Layout(16), &canceller)
                       .status();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  // An unreachable address fails within its deadline.
  const absl::Time start = absl::Now();
  s = client_->Probe("127.0.0.1:1", peer::v1::ProbeRequest(), absl::Now() + absl::Seconds(1));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace shoal::peer
