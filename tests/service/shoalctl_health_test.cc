// `shoalctl health` (the container health probe) against an in-process rpc::Server, which
// serves the standard gRPC health service, over plaintext and over mutual TLS.

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "libs/rpc/server.h"
#include "libs/rpc/tls.h"
#include "services/shoalctl/commands.h"
#include "services/shoalctl/process.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace shoal::shoalctl {
namespace {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result Shoalctl(const std::vector<std::string>& argv) {
  std::ostringstream out, err;
  Environment env;
  env.out = &out;
  env.err = &err;
  Result r;
  r.code = RunShoalctl(argv, env);
  r.out = out.str();
  r.err = err.str();
  return r;
}

class ShoalctlHealthTest : public ::testing::Test {
 protected:
  void StartServer(std::shared_ptr<grpc::ServerCredentials> credentials) {
    rpc::ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.service_name = "health-test";
    options.credentials = std::move(credentials);
    auto server = rpc::Server::Start(options, {&control_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // gRPC's default health service reports the server as a whole ("") and NOT_FOUND for any
  // name not registered with it.
  coordinator::v1::ControlService::Service control_;
  std::unique_ptr<rpc::Server> server_;
};

TEST_F(ShoalctlHealthTest, ServingExitsZero) {
  StartServer(nullptr);
  Result r = Shoalctl({"health", "--target", server_->address(), "--insecure", "--timeout", "5s"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat(server_->address(), " is SERVING\n"));
  // --service "" is the server as a whole, the same check.
  r = Shoalctl({"health", "--target", server_->address(), "--insecure", "--service", ""});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(ShoalctlHealthTest, UnknownServiceFails) {
  StartServer(nullptr);
  Result r = Shoalctl(
      {"health", "--target", server_->address(), "--insecure", "--service", "no.such.Service"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no such service"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(ShoalctlHealthTest, NotServingAfterShutdownFails) {
  StartServer(nullptr);
  const std::string address = server_->address();
  server_->Shutdown(absl::Seconds(1));
  server_.reset();
  // Nothing listens there any more.
  const absl::Time start = absl::Now();
  Result r = Shoalctl({"health", "--target", address, "--insecure", "--timeout", "2s"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(address), std::string::npos) << r.err;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(ShoalctlHealthTest, UnreachableFails) {
  Result r = Shoalctl({"health", "--target", "127.0.0.1:1", "--insecure", "--timeout", "2s"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
}

TEST_F(ShoalctlHealthTest, UsageErrors) {
  EXPECT_EQ(Shoalctl({"health", "--insecure"}).code, 2);
  EXPECT_EQ(Shoalctl({"health", "--target", "nocolon", "--insecure"}).code, 2);
  EXPECT_EQ(Shoalctl({"health", "--target", "127.0.0.1:0", "--insecure"}).code, 2);
  EXPECT_EQ(Shoalctl({"health", "extra", "--target", "127.0.0.1:5", "--insecure"}).code, 2);
  // Neither --tls-dir nor --insecure.
  Result r = Shoalctl({"health", "--target", "127.0.0.1:5"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tls-dir"), std::string::npos) << r.err;
}

TEST_F(ShoalctlHealthTest, MutualTls) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoalctl-health-");
  ASSERT_TRUE(dir.ok());
  const char* source = std::getenv("SHOAL_SOURCE_DIR");
  process::ProcessOptions gen;
  gen.name = "gen-certs";
  gen.binary = absl::StrCat(source != nullptr ? source : ".", "/scripts/gen-certs");
  gen.args = {*dir + "/certs", "server", "client"};
  gen.log_path = *dir + "/gen-certs.log";
  auto proc = process::Process::Start(gen);
  ASSERT_TRUE(proc.ok()) << proc.status();
  auto exit = (*proc)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok() && exit->success()) << (*proc)->LogTail(10);

  rpc::TlsOptions server_tls;
  server_tls.dir = *dir + "/certs/server";
  auto credentials = rpc::Credentials::Create(server_tls);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  StartServer(credentials->server());
  const std::string target = absl::StrCat("127.0.0.1:", server_->port());

  Result r = Shoalctl({"health", "--target", target, "--tls-dir", *dir + "/certs/client"});
  EXPECT_EQ(r.code, 0) << r.err;
  // Plaintext against a TLS server fails.
  r = Shoalctl({"health", "--target", target, "--insecure", "--timeout", "2s"});
  EXPECT_EQ(r.code, 1);
}

}  // namespace
}  // namespace shoal::shoalctl
