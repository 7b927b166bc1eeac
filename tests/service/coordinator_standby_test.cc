// A standby coordinator's address (StandbyServer) and the clients' address lists
// (rpc::AddressList, rpc::CallAny), with real gRPC servers on 127.0.0.1: the standby refuses
// every call UNAVAILABLE naming the active coordinator and says NOT_SERVING; a call given the
// standby's address first moves on to the next address, a call given one address makes one
// attempt; a list that does not parse is refused naming the flag.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/rpc/address_list.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/server.h"
#include "libs/rpc/status.h"
#include "services/coordinator/standby_server.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "tests/testing/reserved_port.h"

namespace shoal::coordinator {
namespace {

using ::testing::HasSubstr;

absl::Status ListTasks(const std::shared_ptr<grpc::Channel>& channel, absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::ListTasksResponse response;
  return rpc::FromGrpcStatus(
      v1::ControlService::NewStub(channel)->ListTasks(&context, v1::ListTasksRequest(), &response));
}

TEST(StandbyServerTest, RefusesEveryCallNamingTheActiveCoordinator) {
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StandbyServer::Start("127.0.0.1:0", nullptr);
  ASSERT_TRUE(standby.ok()) << standby.status();
  standby->get()->SetActive("shoal-coordinator at 10.0.0.1:7000");
  EXPECT_TRUE(standby->get()->was_standby());
  std::shared_ptr<grpc::Channel> channel = rpc::MakeProbeChannel((*standby)->address(), nullptr);
  const absl::Status refused = ListTasks(channel, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("standby"));
  EXPECT_THAT(refused.message(), HasSubstr("10.0.0.1:7000"));

  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(5));
  grpc::health::v1::HealthCheckResponse health;
  ASSERT_TRUE(grpc::health::v1::Health::NewStub(channel)
                  ->Check(&context, grpc::health::v1::HealthCheckRequest(), &health)
                  .ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST(AddressListTest, ACallMovesOnFromAStandbyAndADeadAddress) {
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StandbyServer::Start("127.0.0.1:0", nullptr);
  ASSERT_TRUE(standby.ok()) << standby.status();
  absl::StatusOr<testing::ReservedPort> dead = testing::ReservedPort::Reserve();
  ASSERT_TRUE(dead.ok());
  // Serves, without a ControlService: a call that reaches it is UNIMPLEMENTED, not moved on.
  rpc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<rpc::Server>> active = rpc::Server::Start(options, {});
  ASSERT_TRUE(active.ok()) << active.status();

  absl::StatusOr<std::unique_ptr<rpc::AddressList>> list = rpc::AddressList::Create(
      absl::StrCat((*standby)->address(), ",", dead->address(), ",", (*active)->address()),
      "--coordinator", nullptr, "coordinator");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->Current().address, (*standby)->address());
  const absl::Status reached =
      rpc::CallAny(**list, absl::Now() + absl::Seconds(10),
                   [](const rpc::AddressList::Target& target, absl::Time deadline) {
                     return ListTasks(target.channel, deadline);
                   });
  EXPECT_EQ(reached.code(), absl::StatusCode::kUnimplemented) << reached;
  EXPECT_EQ((*list)->Current().address, (*active)->address());
  // A move from an address that is no longer current is someone else's, already made.
  (*list)->MoveOn((*standby)->address(), "stale");
  EXPECT_EQ((*list)->Current().address, (*active)->address());
}

TEST(AddressListTest, OneAddressIsOneAttempt) {
  absl::StatusOr<testing::ReservedPort> dead = testing::ReservedPort::Reserve();
  ASSERT_TRUE(dead.ok());
  absl::StatusOr<std::unique_ptr<rpc::AddressList>> list =
      rpc::AddressList::Create(dead->address(), "--coordinator", nullptr, "coordinator");
  ASSERT_TRUE(list.ok()) << list.status();
  int attempts = 0;
  const absl::Status refused =
      rpc::CallAny(**list, absl::Now() + absl::Seconds(10),
                   [&](const rpc::AddressList::Target& target, absl::Time deadline) {
                     ++attempts;
                     return ListTasks(target.channel, deadline);
                   });
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_EQ(attempts, 1);
}

TEST(AddressListTest, MalformedListsAreRefusedNamingTheFlag) {
  for (const char* bad : {"", "a:1,", "a:1,a:1", "nohost", "a:1,b"}) {
    absl::StatusOr<std::vector<std::string>> parsed = rpc::AddressList::Parse(bad, "--coordinator");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("--coordinator")) << bad;
  }
  absl::StatusOr<std::vector<std::string>> good =
      rpc::AddressList::Parse("a:1,[::1]:2", "--coordinator");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_THAT(*good, ::testing::ElementsAre("a:1", "[::1]:2"));
}

// A retry loop over three addresses tries each of them at once and backs off between passes:
// 100 ms, then 200 ms (no jitter here), then from 100 ms again after a success.
TEST(AddressListTest, PassBackoffWaitsBetweenPassesOnly) {
  rpc::PassBackoff backoff(BackoffOptions{absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.0}, 3);
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 6; ++i) delays.push_back(backoff.Next());
  EXPECT_THAT(delays, ::testing::ElementsAre(absl::ZeroDuration(), absl::ZeroDuration(),
                                             absl::Milliseconds(100), absl::ZeroDuration(),
                                             absl::ZeroDuration(), absl::Milliseconds(200)));
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), absl::ZeroDuration());
  EXPECT_EQ(backoff.Next(), absl::ZeroDuration());
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(100));

  rpc::PassBackoff one(BackoffOptions{absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.0}, 1);
  EXPECT_EQ(one.Next(), absl::Milliseconds(100));
  EXPECT_EQ(one.Next(), absl::Milliseconds(200));
}

}  // namespace
}  // namespace shoal::coordinator
