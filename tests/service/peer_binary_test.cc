// The shoal-peer binary on its own: flags it refuses at start (the test build's flags included,
// which only shoal-peer-testing has), and a task it cannot run (against a fake coordinator on
// 127.0.0.1:0).

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/shoalctl/process.h"
#include "shoal/coordinator/v1/session.pb.h"
#include "tests/service/fake_coordinator.h"
#include "tests/testing/temp_dir.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;
using shoal::testing::FakeCoordinatorServer;
using ::testing::HasSubstr;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";
constexpr absl::Duration kWait = absl::Seconds(60);

// BINARY in $SHOAL_BIN_DIR; "" when it is not there.
std::string PeerBinary(const std::string& binary = "shoal-peer") {
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  if (bin == nullptr) return "";
  const std::string path = std::string(bin) + "/" + binary;
  return std::filesystem::exists(path) ? path : "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Starts the binary with `args`, its output going to `log_path`. The returned Process stops
// the child when destroyed, so an assertion that ends the test early leaves nothing running.
std::unique_ptr<process::Process> StartPeerBinary(const std::vector<std::string>& args,
                                                  const std::string& log_path,
                                                  const std::string& binary = "shoal-peer") {
  process::ProcessOptions options;
  options.name = binary;
  options.binary = PeerBinary(binary);
  options.args = args;
  options.log_path = log_path;
  auto p = process::Process::Start(std::move(options));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

struct ProcessResult {
  int exit_code = -1;  // -1: did not exit by itself in time, or was killed by a signal
  std::string stderr_text;
};

// Runs `binary` with `args`, waits up to `timeout`, returns its exit code and output.
ProcessResult RunPeer(const std::vector<std::string>& args, absl::Duration timeout,
                      const std::string& binary = "shoal-peer") {
  ProcessResult result;
  auto dir = testing::MakeTestTempDir("shoal-peer-test-");
  if (!dir.ok()) {
    ADD_FAILURE() << dir.status();
    return result;
  }
  const std::string log_path = *dir + "/peer.log";
  if (std::unique_ptr<process::Process> p = StartPeerBinary(args, log_path, binary)) {
    absl::StatusOr<process::ExitStatus> exit = p->Wait(timeout);
    if (!exit.ok()) {
      ADD_FAILURE() << binary << " did not exit within " << timeout;
      p->Stop(absl::ZeroDuration());
    } else if (!exit->signaled) {
      result.exit_code = exit->code;
    }
  }
  result.stderr_text = ReadFile(log_path);
  std::filesystem::remove_all(*dir);
  return result;
}

class PeerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (PeerBinary().empty()) GTEST_FAIL() << "shoal-peer not found via SHOAL_BIN_DIR";
    if (PeerBinary("shoal-peer-testing").empty()) {
      GTEST_FAIL() << "shoal-peer-testing not found via SHOAL_BIN_DIR";
    }
  }
};

TEST_F(PeerBinaryTest, BadFlagsExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::string ok_coord = "--coordinator=127.0.0.1:1";
  const std::string ok_data = std::string("--data-dir=") + kDataDir;
  std::vector<Case> cases = {
      {{ok_coord, ok_data, "--shard=4/4"}, "--shard"},
      {{ok_coord, ok_data, "--shard=1/0"}, "--shard"},
      {{ok_coord, ok_data, "--shard=x"}, "--shard"},
      {{ok_coord, "--data-dir=/nonexistent/data", "--shard=0/4"}, "--data-dir"},
      {{ok_coord, "--data-dir=/etc/hostname", "--shard=0/4"}, "--data-dir"},
      {{ok_coord, "--shard=0/4", "--insecure"}, "--data-dir"},
      {{ok_coord, ok_data, "--shard=0/4", "--device=tpu"}, "--device"},
      {{ok_data, "--shard=0/4"}, "--coordinator"},
      {{"--coordinator=nonsense", ok_data, "--shard=0/4"}, "--coordinator"},
      {{ok_coord, ok_data, "--shard=0/4"}, "--tls-dir"},  // neither --tls-dir nor --insecure
      {{ok_coord, ok_data, "--shard=0/4", "--tls-dir=/nonexistent"}, "--tls-dir"},
      {{ok_coord, ok_data, "--shard=0/4", "--tls-dir=/tmp", "--insecure"}, "--insecure"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--advertise=nonsense"}, "--advertise"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--advertise=127.0.0.1:0"}, "--advertise"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--relay=nonsense", "--name=p"}, "--relay"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--relay=127.0.0.1:1"},
       "--relay needs --name"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--relay=127.0.0.1:1", "--name=p",
        "--advertise=127.0.0.1:2"},
       "--relay and --advertise"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--relay=auto", "--advertise=127.0.0.1:2"},
       "--relay and --advertise"},
      // The test build's flags: shoal-peer does not have them.
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--test-byzantine=sign-flip"},
       "unknown flag --test-byzantine"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--test-slow-batch=100"},
       "unknown flag --test-slow-batch"},
  };
  // shoal-peer-testing: the same flags, and its own.
  std::vector<Case> testing_cases = {
      {{ok_coord, ok_data, "--shard=4/4"}, "--shard"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--test-byzantine=scale:x"},
       "--test-byzantine"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--test-slow-batch=-5"},
       "--test-slow-batch"},
      {{ok_coord, ok_data, "--shard=0/4", "--insecure", "--test-slow-batch=3600001"},
       "--test-slow-batch"},
  };
  for (const auto& [binary, binary_cases] :
       {std::pair{"shoal-peer", cases}, std::pair{"shoal-peer-testing", testing_cases}}) {
    for (const Case& c : binary_cases) {
      ProcessResult r = RunPeer(c.args, absl::Seconds(30), binary);
      EXPECT_EQ(r.exit_code, 2) << binary << " " << c.flag << ": " << r.stderr_text;
      EXPECT_THAT(r.stderr_text, HasSubstr(c.flag)) << binary;
      // One clear line.
      EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1)
          << binary << ": " << r.stderr_text;
    }
  }
}

TEST_F(PeerBinaryTest, UnknownModelReportsAnErrorAndExitsNonZero) {
  FakeCoordinatorServer coordinator;
  ASSERT_TRUE(coordinator.server);
  auto dir = testing::MakeTestTempDir("shoal-peer-test-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string log_path = *dir + "/peer.log";
  // No thread: the child runs on its own while this thread plays the coordinator, and `peer`
  // stops it on every way out of the test (it used to be a thread writing into this frame's
  // locals after an ASSERT had returned).
  std::unique_ptr<process::Process> peer =
      StartPeerBinary({"--coordinator=" + coordinator.address(), "--listen=127.0.0.1:0",
                       "--metrics-listen=127.0.0.1:0", std::string("--data-dir=") + kDataDir,
                       "--shard=0/1", "--name=peer-bad", "--insecure"},
                      log_path);
  ASSERT_NE(peer, nullptr);
  auto hello = coordinator.service.WaitHello(1, kWait);
  ASSERT_TRUE(hello) << ReadFile(log_path);
  CoordinatorEvent e;
  common::v1::TaskSpec spec;
  spec.set_name("small");
  spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
  spec.set_model("resnet");
  spec.mutable_dataset()->set_name("fashion-mnist");
  *e.mutable_task_assigned()->mutable_spec() = spec;
  e.mutable_task_assigned()->set_aggregator_address("127.0.0.1:1");
  ASSERT_TRUE(coordinator.service.Write(e));
  auto error = coordinator.service.Take(PeerMessage::kError, kWait);
  ASSERT_TRUE(error) << ReadFile(log_path);
  EXPECT_EQ(error->task(), "small");
  EXPECT_THAT(error->error().message(), HasSubstr("unknown model \"resnet\""));
  absl::StatusOr<process::ExitStatus> exit = peer->Wait(kWait);
  ASSERT_TRUE(exit.ok()) << "shoal-peer did not exit: " << exit.status();
  EXPECT_FALSE(exit->signaled) << exit->ToString();
  EXPECT_NE(exit->code, 0);
  EXPECT_THAT(ReadFile(log_path),
              HasSubstr("unknown model \"resnet\" (known: cnn, dp-cnn, mlp, scatter-cnn, "
                        "scatter-linear, wide-mlp, torchscript)"));
  std::filesystem::remove_all(*dir);
}

}  // namespace
}  // namespace shoal::peer
