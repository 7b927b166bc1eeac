// rpc::GrpcLifetime: a program exits at once after a large write that found the socket full,
// instead of waiting out the 10 s poll of gRPC 1.51's TCP backup poller in the library's
// teardown (a peer stopped right after its upload probe failed a cluster test in CI this way).
//
// The child process (a death test) streams to a stalled HTTP/2 server: one that grants a 2 GiB
// window and then reads nothing, so the write fills the socket and gRPC starts its backup
// poller. The server then resets the connection (the write fails: a stalled write does not
// heed the call's deadline), and the child ends through GrpcLifetime::Exit.

#include "libs/rpc/grpc_lifetime.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"
#include "tests/testing/joining_thread.h"

namespace shoal::rpc {
namespace {

// Listens on 127.0.0.1; answers each connection with SETTINGS (initial window 2^31 - 1) and a
// connection WINDOW_UPDATE, then never reads. Holds the connections until destroyed.
class StalledHttp2Server {
 public:
  StalledHttp2Server() {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    const int small = 4096;  // a receive buffer that fills at once
    setsockopt(listener_, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listener_, 4) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::_Exit(4);
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    acceptor_.emplace([this] { Accept(); }, [this] { shutdown(listener_, SHUT_RDWR); });
  }
  ~StalledHttp2Server() {
    acceptor_.reset();
    Reset();
    close(listener_);
  }

  const std::string& address() const { return address_; }

  // Waits until a connection has unread data that stopped growing for 100 ms: its receive
  // buffer is full, and so is the client's send buffer behind it.
  void WaitUntilStalled() {
    int last = -1;
    for (int stable = 0; stable < 10; absl::SleepFor(absl::Milliseconds(10))) {
      int queued = 0;
      {
        absl::MutexLock lock(&mu_);
        if (!connections_.empty()) ioctl(connections_.back(), FIONREAD, &queued);
      }
      stable = queued > 0 && queued == last ? stable + 1 : 0;
      last = queued;
    }
  }

  // Closes every connection with its data unread, which resets it.
  void Reset() {
    absl::MutexLock lock(&mu_);
    for (int fd : connections_) close(fd);
    connections_.clear();
  }

 private:
  void Accept() {
    // SETTINGS: INITIAL_WINDOW_SIZE (0x4) = 0x7fffffff; WINDOW_UPDATE on stream 0: 0x7fff0000.
    constexpr std::array<unsigned char, 28> kFrames = {
        0,    0, 6, 0x4, 0,   0, 0, 0, 0, 0, 0x4,  0x7f, 0xff, 0xff,
        0xff, 0, 0, 4,   0x8, 0, 0, 0, 0, 0, 0x7f, 0xff, 0,    0};
    for (int fd; (fd = accept(listener_, nullptr, nullptr)) >= 0;) {
      if (write(fd, kFrames.data(), kFrames.size()) != static_cast<ssize_t>(kFrames.size())) {
        std::_Exit(5);
      }
      absl::MutexLock lock(&mu_);
      connections_.push_back(fd);
    }
  }

  int listener_ = -1;
  std::string address_;
  absl::Mutex mu_;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);
  std::optional<testing::JoiningThread> acceptor_;
};

// Streams 32 MiB to `address` (SessionService.MeasureUpload) until the write fails.
void StallAWrite(const std::string& address) {
  auto stub = coordinator::v1::SessionService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  coordinator::v1::UploadProbe probe;
  probe.mutable_payload()->assign(1 << 20, 'z');
  coordinator::v1::UploadProbeResult result;
  auto writer = stub->MeasureUpload(&context, &result);
  for (int i = 0; i < 32 && writer->Write(probe); ++i) {
  }
  // The server reads nothing: the call cannot succeed.
  if (writer->Finish().ok()) std::_Exit(3);
}

// A teardown that finishes in time: Exit() returns the code (the child adds 1 to it, which a
// process ended inside Exit() would not have).
TEST(GrpcLifetimeTest, ExitReturnsTheCodeWhenTheTeardownFinishesInTime) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        GrpcLifetime grpc;
        std::exit(grpc.Exit(2, absl::Seconds(30)) + 1);
      },
      ::testing::ExitedWithCode(3), "");
}

// A teardown that never finishes: Exit() logs it and ends the process with the code.
TEST(GrpcLifetimeTest, ExitEndsTheProcessWhenTheTeardownOutlastsTheBound) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const absl::Time start = absl::Now();
  EXPECT_EXIT(
      {
        GrpcLifetime grpc([] {
          grpc_shutdown_blocking();
          absl::Notification never;
          never.WaitForNotification();
        });
        std::exit(grpc.Exit(2, absl::Milliseconds(200)) + 1);
      },
      ::testing::ExitedWithCode(2), "library teardown is still waiting after 200ms");
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // not forever: the bound ended it
}

// The real thing. Without the bound, this child took 10 s (the backup poller's poll) in one run
// of three on a loaded machine and in none of ten on a quiet one: whether gRPC leaves the poller
// waiting is up to its threads. With the bound it must end within 6 s on every run.
TEST(GrpcLifetimeTest, ExitDoesNotWaitOutTheBackupPollerAfterAStalledWrite) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const absl::Time start = absl::Now();
  EXPECT_EXIT(
      {
        GrpcLifetime grpc;
        {
          StalledHttp2Server server;
          testing::JoiningThread writer([&] { StallAWrite(server.address()); });
          server.WaitUntilStalled();
          server.Reset();
        }
        std::exit(grpc.Exit(7, absl::Seconds(1)));
      },
      ::testing::ExitedWithCode(7), "");
  // The stall, the 1 s bound and the child's start; the backup poller alone polls for 10 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

}  // namespace
}  // namespace shoal::rpc
