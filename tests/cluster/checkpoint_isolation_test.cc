// One task's checkpoints never delay another task's round events: a real shoal-coordinator and
// shoal-aggregator (plaintext, 127.0.0.1) run two federated tasks of light peers in this process
// (tests/bench/light_peer.h): "heavy", whose model is 100 MiB and is checkpointed every round
// (the coordinator pulls and writes 100 MiB per round), and "light", a tiny model. The light
// task's round-open and round-close latencies, as its peers see them, stay far below the heavy
// checkpoint's duration. Prints the figures.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/rpc/channel.h"
#include "services/shoalctl/process.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "tests/bench/light_peer.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;

constexpr int kHeavyFloats = 100 * (1 << 20) / 4;  // 100 MiB

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

class CheckpointIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeTestTempDir("shoal-isolation-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    const char* bin = std::getenv("SHOAL_BIN_DIR");
    bin_dir_ = bin != nullptr ? bin : "build/bin";
    auto coordinator = Start("coordinator", "shoal-coordinator", {"--state-dir=" + dir_});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    auto aggregator =
        Start("aggregator", "shoal-aggregator", {"--coordinator=" + coordinator_address_});
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = *std::move(aggregator);
    control_ = cv1::ControlService::NewStub(rpc::MakeChannel(coordinator_address_));
  }

  void TearDown() override {
    heavy_.reset();
    light_.reset();
    std::vector<process::Process*> services;
    if (aggregator_) services.push_back(aggregator_.get());
    process::StopInOrder({services, {coordinator_.get()}}, testing::Scaled(absl::Seconds(10)));
  }

  absl::StatusOr<std::unique_ptr<process::Process>> Start(const std::string& name,
                                                          const std::string& binary,
                                                          std::vector<std::string> args) {
    const std::string address_file = absl::StrCat(dir_, "/", name, ".addr");
    args.insert(args.end(), {"--insecure", "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                             "--address-file=" + address_file});
    process::ProcessOptions options;
    options.name = name;
    options.binary = absl::StrCat(bin_dir_, "/", binary);
    options.args = std::move(args);
    options.log_path = absl::StrCat(dir_, "/", name, ".log");
    auto started = process::Process::Start(options);
    if (!started.ok()) return started.status();
    auto addresses = process::WaitForAddressFile(address_file, started->get(),
                                                 testing::Scaled(absl::Seconds(30)));
    if (!addresses.ok()) return addresses.status();
    if (name == "coordinator") {
      coordinator_address_ = addresses->at("grpc");
      coordinator_metrics_ = addresses->at("metrics");
    }
    return started;
  }

  absl::Status CreateTask(const std::string& name, int peers) {
    cv1::CreateTaskRequest request;
    common::v1::TaskSpec& spec = *request.mutable_spec();
    spec.set_name(name);
    spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
    spec.set_model("mlp");
    spec.mutable_dataset()->set_name("fashion-mnist");
    spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
    spec.set_batch_size(32);
    spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
    spec.mutable_optimizer()->set_learning_rate(0.01);
    spec.set_round_batches(1);
    spec.set_rounds(100000);  // runs until the test ends
    spec.set_min_participants(static_cast<uint32_t>(peers));
    spec.set_max_participants(static_cast<uint32_t>(peers));
    spec.set_round_deadline_seconds(120);
    spec.set_aggregation(common::v1::AGGREGATION_MEAN);
    spec.set_seed(1);
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(10));
    cv1::CreateTaskResponse response;
    grpc::Status s = control_->CreateTask(&context, request, &response);
    if (!s.ok()) return absl::InternalError("CreateTask: " + s.error_message());
    return absl::OkStatus();
  }

  int64_t HistorySize(const std::string& name) {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(10));
    cv1::GetTaskStatusRequest request;
    request.set_name(name);
    cv1::GetTaskStatusResponse response;
    if (!control_->GetTaskStatus(&context, request, &response).ok()) return -1;
    return response.status().history_size();
  }

  // The coordinator's shoal_coordinator_bytes_received_total: checkpoint bytes pulled so far.
  double BytesPulled() {
    auto metrics = HttpGet(coordinator_metrics_, "/metrics");
    if (!metrics.ok()) return -1;
    const std::string name = "\nshoal_coordinator_bytes_received_total ";
    const size_t at = metrics->find(name);
    return at == std::string::npos ? -1 : std::stod(metrics->substr(at + name.size()));
  }

  std::unique_ptr<bench::Fleet> StartFleet(const std::string& prefix, int peers, int floats) {
    bench::Fleet::Options options;
    options.peers = peers;
    options.name_prefix = prefix;
    options.coordinator = coordinator_address_;
    options.model_floats = floats;
    options.call_threads = 2;
    options.call_timeout = testing::Scaled(options.call_timeout);
    options.call_budget = testing::Scaled(options.call_budget);
    auto fleet = std::make_unique<bench::Fleet>(options);
    fleet->Start();
    return fleet;
  }

  std::string dir_;
  std::string bin_dir_;
  std::string coordinator_address_;
  std::string coordinator_metrics_;
  std::unique_ptr<process::Process> coordinator_;
  std::unique_ptr<process::Process> aggregator_;
  std::unique_ptr<cv1::ControlService::Stub> control_;
  std::unique_ptr<bench::Fleet> heavy_;
  std::unique_ptr<bench::Fleet> light_;
};

TEST_F(CheckpointIsolationTest, HeavyCheckpointsDoNotDelayAnotherTasksRounds) {
  // Tasks take peers in creation order, up to max_participants: "heavy" gets the first fleet.
  {
    absl::Status created = CreateTask("heavy", 1);
    ASSERT_TRUE(created.ok()) << created;
  }
  heavy_ = StartFleet("heavy", 1, kHeavyFloats);
  ASSERT_TRUE(WaitUntil([&] { return heavy_->assigned() == 1; }, absl::Seconds(30)));
  ASSERT_TRUE(WaitUntil([&] { return HistorySize("heavy") >= 1; }, absl::Minutes(2)))
      << "the heavy task's first round did not complete";
  {
    absl::Status created = CreateTask("light", 2);
    ASSERT_TRUE(created.ok()) << created;
  }
  light_ = StartFleet("light", 2, 16);

  // Measure while the coordinator pulls and writes 4 more checkpoints of the heavy task (one at
  // a time; its rounds go on meanwhile).
  constexpr double kCheckpointBytes = 4.0 * kHeavyFloats;
  const double pulled_before = BytesPulled();
  const int64_t heavy_before = HistorySize("heavy");
  const absl::Time start = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return BytesPulled() >= pulled_before + 4 * kCheckpointBytes; },
                        absl::Minutes(3), absl::Milliseconds(100)))
      << "the heavy task stopped checkpointing";
  const double checkpoint_s = absl::ToDoubleSeconds(absl::Now() - start) / 4;
  const int64_t heavy_rounds = HistorySize("heavy") - heavy_before;
  light_->Stop();
  heavy_->Stop();
  EXPECT_EQ(heavy_->errors().calls_failed.load() + light_->errors().calls_failed.load(), 0);

  // Close: the round's last accepted push -> ModelPublished at a peer. Open: the last
  // ModelPublished -> the next round's RoundStarted at a peer.
  std::vector<double> close_ms, open_ms;
  const std::map<uint64_t, bench::RoundTimes> rounds = light_->Rounds();
  for (auto it = rounds.begin(); it != rounds.end(); ++it) {
    const bench::RoundTimes& r = it->second;
    if (r.pushed.size() != 2 || r.published.size() != 2) continue;
    const double published = *std::max_element(r.published.begin(), r.published.end());
    close_ms.push_back(1000 * (published - *std::max_element(r.pushed.begin(), r.pushed.end())));
    auto next = std::next(it);
    if (next != rounds.end() && next->second.started.size() == 2) {
      open_ms.push_back(
          1000 * (*std::min_element(next->second.started.begin(), next->second.started.end()) -
                  published));
    }
  }
  std::printf(
      "[ figure ] light task while the heavy one checkpoints 100 MiB (4 checkpoints, %.2f s "
      "each; %lld heavy rounds meanwhile): %zu light rounds; close p50 %.1f ms p90 %.1f ms "
      "max %.1f ms; open p50 %.1f ms p90 %.1f ms max %.1f ms\n",
      checkpoint_s, static_cast<long long>(heavy_rounds), close_ms.size(),
      Percentile(close_ms, 0.5), Percentile(close_ms, 0.9), Percentile(close_ms, 1.0),
      Percentile(open_ms, 0.5), Percentile(open_ms, 0.9), Percentile(open_ms, 1.0));
  ASSERT_GE(close_ms.size(), 4u) << "the light task barely ran";
  // Generous bounds: a light round event waits for nothing of the heavy task; before the
  // coordinator had executors, each one could wait for a whole 100 MiB checkpoint.
  EXPECT_LT(Percentile(close_ms, 0.9), 1000);
  EXPECT_LT(Percentile(open_ms, 0.9), 1000);
}

}  // namespace
}  // namespace shoal::testing
