// A real coordinator (in-process, gRPC on 127.0.0.1:0) times nodes' uploads, dials back a peer's
// advertised address, and lists the nodes with their capacity (ControlService.ListNodes).

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "libs/capacity/aggregator_rtt.h"
#include "libs/capacity/upload_probe.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/server.h"
#include "services/coordinator/coordinator_server.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"

namespace shoal::coordinator {
namespace {

// A bound socket that never listens: the port stays ours, and a connection to it is refused.
struct ClosedPort {
  ClosedPort() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    }
  }
  ~ClosedPort() {
    if (fd >= 0) close(fd);
  }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  int fd = -1;
  std::string address;  // "" when the socket could not be bound
};

// A socket that listens but never accepts: the kernel completes each TCP handshake, and the
// client then waits for an HTTP/2 greeting that never comes, so a dial costs its whole timeout
// (as an address that drops packets does).
struct SilentPort : ClosedPort {
  SilentPort() {
    if (fd >= 0 && listen(fd, 1024) != 0) address.clear();
  }
};

class CoordinatorCapacityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-capacity-service-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    CoordinatorServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.state_dir = dir_.string();
    options.tls.insecure = true;
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = rpc::MakeChannel(server_->address());
    session_ = v1::SessionService::NewStub(channel_);
    control_ = v1::ControlService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // The peer's node once the coordinator has dialed it back, or the last seen at the deadline.
  v1::NodeInfo WaitForDial(const std::string& peer) {
    v1::NodeInfo node;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      rpc::SetTimeout(context, absl::Seconds(5));
      v1::ListNodesResponse nodes;
      EXPECT_TRUE(control_->ListNodes(&context, v1::ListNodesRequest(), &nodes).ok());
      for (const v1::NodeInfo& n : nodes.peers()) {
        if (n.id() == peer) node = n;
      }
      if (node.capacity().reachability() != common::v1::REACHABILITY_UNKNOWN) return node;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return node;
  }

  std::filesystem::path dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SessionService::Stub> session_;
  std::unique_ptr<v1::ControlService::Stub> control_;
};

TEST_F(CoordinatorCapacityTest, AnUploadIsTimedAndCounted) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(30));
  absl::StatusOr<double> rate = capacity::MeasureUpload(*session_, context, 3'000'000);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GT(*rate, 1e6);  // over 1 MB/s on 127.0.0.1, however loaded the machine
}

TEST_F(CoordinatorCapacityTest, OversizedUploadsAreRefused) {
  // A chunk over 4 MiB: the server's message limit or the probe's own check refuses it.
  {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(30));
    v1::UploadProbeResult result;
    auto writer = session_->MeasureUpload(&context, &result);
    v1::UploadProbe probe;
    probe.mutable_payload()->assign((4 << 20) + 1, 'x');
    writer->Write(probe);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_code() << " " << status.error_message();
  }
  // More than 64 MiB in all, in chunks of 1 MiB.
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(60));
  v1::UploadProbeResult result;
  auto writer = session_->MeasureUpload(&context, &result);
  v1::UploadProbe probe;
  probe.mutable_payload()->assign(1 << 20, 'x');
  for (int i = 0; i < 70 && writer->Write(probe); ++i) {
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("at most 67108864 bytes"), std::string::npos)
      << status.error_message();
}

TEST_F(CoordinatorCapacityTest, APeerIsDialedBackAndListedWithItsCapacity) {
  // A server the coordinator can reach (every Shoal server runs the health service) ...
  rpc::ServerOptions listening;
  listening.listen = "127.0.0.1:0";
  listening.service_name = "test-peer";
  auto reachable = rpc::Server::Start(listening, {});
  ASSERT_TRUE(reachable.ok()) << reachable.status();
  // ... and an address nothing listens on.
  ClosedPort closed;
  ASSERT_FALSE(closed.address.empty());
  struct Session {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::PeerMessage, v1::CoordinatorEvent>> stream;
  };
  auto open = [&](Session& s, const std::string& name, const std::string& address) {
    s.stream = session_->Session(&s.context);
    v1::PeerMessage hello;
    hello.mutable_hello()->set_name(name);
    hello.mutable_hello()->set_listen_address(address);
    hello.mutable_hello()->set_shard_count(1);
    hello.mutable_hello()->mutable_capacity()->set_cpu_cores(3);
    hello.mutable_hello()->mutable_capacity()->set_matmul_gflops(7.5);
    ASSERT_TRUE(s.stream->Write(hello));
    v1::CoordinatorEvent welcome;
    ASSERT_TRUE(s.stream->Read(&welcome));
    ASSERT_TRUE(welcome.has_welcome());
  };
  Session a, b;
  absl::Cleanup end = [&] {
    for (Session* s : {&a, &b}) {
      if (s->stream == nullptr) continue;
      s->context.TryCancel();
      s->stream->Finish();
    }
  };
  open(a, "peer-a", (*reachable)->address());
  open(b, "peer-b", closed.address);

  const v1::NodeInfo na = WaitForDial("peer-a");
  EXPECT_EQ(na.capacity().reachability(), common::v1::REACHABILITY_REACHABLE);
  EXPECT_EQ(na.capacity().cpu_cores(), 3u);
  EXPECT_DOUBLE_EQ(na.capacity().matmul_gflops(), 7.5);
  EXPECT_EQ(na.address(), (*reachable)->address());
  EXPECT_EQ(WaitForDial("peer-b").capacity().reachability(), common::v1::REACHABILITY_UNREACHABLE);
  (*reachable)->Shutdown(absl::ZeroDuration());
}

// A coordinator that stops does not first dial back every peer it has queued: a fleet of peers
// whose addresses do not answer (each dial its whole 3 s timeout, two at a time) would hold its
// shutdown for minutes. The sessions go over the in-process channel, as a simulation's do.
TEST_F(CoordinatorCapacityTest, ShutdownDropsTheQueuedDialBacks) {
  SilentPort silent;
  ASSERT_FALSE(silent.address.empty());
  constexpr int kPeers = 100;
  auto session = v1::SessionService::NewStub(server_->InProcessChannel());
  struct Session {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::PeerMessage, v1::CoordinatorEvent>> stream;
  };
  std::vector<std::unique_ptr<Session>> sessions;
  absl::Cleanup end = [&] {
    for (auto& s : sessions) {
      s->context.TryCancel();
      s->stream->Finish();
    }
  };
  for (int i = 0; i < kPeers; ++i) {
    sessions.push_back(std::make_unique<Session>());
    Session* s = sessions.back().get();
    s->stream = session->Session(&s->context);
    v1::PeerMessage hello;
    hello.mutable_hello()->set_name("peer-" + std::to_string(i));
    hello.mutable_hello()->set_listen_address(silent.address);
    hello.mutable_hello()->set_shard_count(1);
    ASSERT_TRUE(s->stream->Write(hello));
    v1::CoordinatorEvent welcome;
    ASSERT_TRUE(s->stream->Read(&welcome));
    ASSERT_TRUE(welcome.has_welcome());
  }
  const absl::Time start = absl::Now();
  server_->Shutdown();
  const absl::Duration took = absl::Now() - start;
  // Draining the queue would take kPeers / 2 dials of 3 s each (150 s); dropping it, the dials
  // already running (3 s).
  EXPECT_LT(took, absl::Seconds(30)) << "the shutdown waited for the queued dial-backs";
  std::printf("shutdown with %d peers' dial-backs queued took %s\n", kPeers,
              absl::FormatDuration(took).c_str());
}

// What a peer does before its Hello (SessionClient): ask for the aggregators, time each one.
TEST_F(CoordinatorCapacityTest, AggregatorsAreListedAndTheirRoundTripsMeasured) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(10));
  v1::ListAggregatorsResponse listed;
  ASSERT_TRUE(session_->ListAggregators(&context, v1::ListAggregatorsRequest(), &listed).ok());
  EXPECT_EQ(listed.addresses_size(), 0) << "none registered yet";

  rpc::ServerOptions listening;
  listening.listen = "127.0.0.1:0";
  listening.service_name = "test-aggregator";
  auto answering = rpc::Server::Start(listening, {});
  ASSERT_TRUE(answering.ok()) << answering.status();
  ClosedPort closed;
  ASSERT_FALSE(closed.address.empty());
  const absl::Time start = absl::Now();
  const std::vector<common::v1::AggregatorRtt> rtts = capacity::MeasureAggregatorRtts(
      {(*answering)->address(), closed.address}, /*credentials=*/nullptr, absl::Seconds(5));
  // Both measured at once: the refused one does not wait for the other.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(rtts.size(), 1u) << "the closed port is left out";
  EXPECT_EQ(rtts[0].address(), (*answering)->address());
  EXPECT_GT(rtts[0].rtt_us(), 0u);
  EXPECT_LT(rtts[0].rtt_us(), 5'000'000u);
  (*answering)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace shoal::coordinator
