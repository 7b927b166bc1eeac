// Federated-sync training with real processes on 127.0.0.1: a coordinator, an aggregator and
// three peers train a small model on real Fashion-MNIST; one peer is SIGKILLed mid-round.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-cluster-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

TEST(FederatedClusterTest, PeerKilledMidRoundDoesNotStopTraining) {
  Cluster cluster(TempDir());
  cluster.set_batch_floor_ms(50);  // rounds of at least 20 x 50 ms: round 2 is seen training
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  {
    absl::Status started = cluster.StartAggregator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  {
    absl::Status started = cluster.StartPeers(0, 3, 3);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }

  // All peers are connected before the task exists, so every round has all of them.
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(30)).ok());
  const common::v1::TaskSpec spec = SmallTask("fmnist-small");
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // Wait until round 2 is training with all three peers, then kill one of them.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.round() >= 2 && s.phase() == cv1::ROUND_PHASE_TRAINING &&
               s.participants_size() == 3;
      },
      absl::Minutes(3), "round 2 with 3 peers");
  ASSERT_TRUE(status.ok()) << status.status();
  const uint64_t killed_round = status->round();
  cluster.peer(2).process->Signal(SIGKILL);

  // The killed round still closes (well within its deadline) and the rest of the task runs
  // with the two survivors.
  status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(5), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  for (const cv1::RoundSummary& round : status->history()) {
    EXPECT_LT(round.duration_ms(), spec.round_deadline_seconds() * 1000 + 2000)
        << "round " << round.round();
    if (round.round() < killed_round) {
      EXPECT_EQ(round.participants_size(), 3) << "round " << round.round();
    }
    if (round.round() > killed_round) {
      EXPECT_THAT(round.participants(), Not(Contains("peer-2"))) << "round " << round.round();
      EXPECT_EQ(round.participants_size(), 2) << "round " << round.round();
    }
  }
  // The model improved: the final model beats chance by far on the peers' test slices.
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  ASSERT_TRUE(last.evaluated()) << last.ShortDebugString();
  EXPECT_GT(last.test_accuracy(), 0.6);
  EXPECT_LT(last.mean_train_loss(), status->history(0).mean_train_loss());

  // Every service answers the standard gRPC health check.
  for (const std::string& address :
       {cluster.coordinator().address, cluster.aggregator().address, cluster.peer(0).address}) {
    auto health =
        grpc::health::v1::Health::NewStub(rpc::MakeChannel(address, cluster.ClientCredentials()));
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(5));
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status s = health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
    ASSERT_TRUE(s.ok()) << address << ": " << s.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << address;
  }

  // Every service exports its metrics.
  auto coordinator_metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_THAT(*coordinator_metrics, HasSubstr("shoal_coordinator_rounds_completed_total 6"));
  EXPECT_THAT(*coordinator_metrics, HasSubstr("shoal_coordinator_peers_crashed_total 1"));
  EXPECT_THAT(*coordinator_metrics,
              HasSubstr("shoal_coordinator_participants{mode=\"federated-sync\"} 0"));
  auto aggregator_metrics = HttpGet(cluster.aggregator().metrics_address, "/metrics");
  ASSERT_TRUE(aggregator_metrics.ok());
  EXPECT_THAT(*aggregator_metrics, HasSubstr("shoal_aggregator_updates_accepted_total"));
  auto peer_metrics = HttpGet(cluster.peer(0).metrics_address, "/metrics");
  ASSERT_TRUE(peer_metrics.ok());
  EXPECT_THAT(*peer_metrics, HasSubstr("shoal_peer_rounds_completed_total"));

  // The surviving peers are still connected and idle; stopping them is clean (exit 0).
  for (int i = 0; i < 2; ++i) {
    process::ExitStatus exit = cluster.peer(i).process->Stop(absl::Seconds(10));
    EXPECT_TRUE(exit.success()) << "peer-" << i << ": " << exit.ToString();
  }
}

// A graceful restart (SIGTERM) keeps the completed task, its history and its checkpoint.
void CoordinatorRestartKeepsTasksAndCheckpoints(Cluster& cluster) {
  common::v1::TaskSpec spec = SmallTask("survives-restart");
  spec.set_rounds(2);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto before = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(3), "task completion");
  ASSERT_TRUE(before.ok()) << before.status();

  // A graceful stop (SIGTERM) exits 0; a new coordinator on the same state dir has the task.
  process::ExitStatus exit = cluster.coordinator().process->Stop(absl::Seconds(10));
  EXPECT_TRUE(exit.success()) << exit.ToString();
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  auto after = cluster.Status(spec.name());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), cv1::TASK_STATE_COMPLETED);
  ASSERT_EQ(after->history_size(), before->history_size());
  EXPECT_EQ(after->history(1).test_accuracy(), before->history(1).test_accuracy());
  EXPECT_EQ(after->model_version(), before->model_version());

  // The final model can be downloaded from the checkpoint.
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(30));
  cv1::GetModelRequest request;
  request.set_name(spec.name());
  auto reader = cluster.control().GetModel(&context, request);
  auto model = rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &context);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->meta.version(), before->model_version());
  EXPECT_GT(model->model.values.size(), 100000u);

  // Unknown tasks are NOT_FOUND.
  EXPECT_EQ(cluster.Status("nope").status().code(), absl::StatusCode::kNotFound);

  // The worked example of docs/reference/grpc-api.md, a separate program, reads the same API
  // over mutual TLS.
  process::ProcessOptions example;
  example.name = "shoal-control-example";
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  example.binary = std::string(bin != nullptr ? bin : "build/bin") + "/shoal-control-example";
  example.args = {cluster.coordinator().address, cluster.ClientTlsDir(), spec.name()};
  example.log_path = cluster.dir() + "/example.log";
  auto run = process::Process::Start(std::move(example));
  ASSERT_TRUE(run.ok()) << run.status();
  auto exit_status = (*run)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit_status.ok());
  const std::string output = (*run)->LogTail(20);
  EXPECT_TRUE(exit_status->success()) << output;
  EXPECT_THAT(output, HasSubstr("task survives-restart: TASK_STATE_COMPLETED, round 2 of 2"));
  EXPECT_THAT(output, HasSubstr("round 2: 2 peers"));
}

// A crash (SIGKILL) mid-task: the task resumes from its newest checkpoint and completes.
void CoordinatorCrashMidTaskResumesFromCheckpoint(Cluster& cluster) {
  common::v1::TaskSpec spec = SmallTask("survives-crash");
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto before = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.round() >= 3 && s.phase() == cv1::ROUND_PHASE_TRAINING;
      },
      absl::Minutes(3), "round 3");
  ASSERT_TRUE(before.ok()) << before.status();

  // Files no checkpoint names: of a task deleted while the coordinator was down (unchanged for
  // two hours: the new process deletes it), and one too recent to tell (kept).
  const std::string checkpoints = cluster.dir() + "/state/checkpoints";
  const std::string stale = checkpoints + "/deleted-00000000000000aa.model";
  const std::string recent = checkpoints + "/deleted-00000000000000bb.model";
  for (const std::string& path : {stale, recent}) std::ofstream(path) << "model";
  std::filesystem::last_write_time(
      stale, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));

  // SIGKILL: no goodbye, whatever was in flight is lost. The new process on the same address and
  // state dir resumes from the newest checkpoint; the peers reconnect on their own.
  absl::Status restarted = cluster.RestartCoordinator(/*crash=*/true);
  ASSERT_TRUE(restarted.ok()) << restarted << cluster.LogTails();
  // Swept beside serving, soon after the start (the log line comes once it is done).
  EXPECT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(cluster.coordinator().process->LogTail(200),
                                 "files of " + checkpoints + " that no checkpoint names");
      },
      absl::Seconds(10)));
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(recent));
  auto after = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(4), "completion after the restart");
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->history_size(), static_cast<int>(spec.rounds()));
  for (int i = 0; i < after->history_size(); ++i) {
    EXPECT_EQ(after->history(i).round(), static_cast<uint64_t>(i + 1));
    EXPECT_FALSE(after->history(i).participants().empty()) << "round " << i + 1;
  }
  // Versions only move forward: no round was averaged twice or lost.
  for (int i = 1; i < after->history_size(); ++i) {
    EXPECT_GT(after->history(i).model_version(), after->history(i - 1).model_version());
  }
  EXPECT_GT(after->history(after->history_size() - 1).test_accuracy(), 0.6);
}

// The two above on one cluster of two peers, a task each: the crash first, then the graceful
// restart.
TEST(FederatedClusterTest, CoordinatorCrashAndRestartKeepTasksAndCheckpoints) {
  Cluster cluster(TempDir());
  cluster.set_batch_floor_ms(50);  // rounds of at least 1 s: the crash comes mid-task
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeers(0, 2, 2).ok()) << cluster.LogTails();
  CoordinatorCrashMidTaskResumesFromCheckpoint(cluster);
  if (HasFatalFailure()) return;
  CoordinatorRestartKeepsTasksAndCheckpoints(cluster);
}

// Every service speaks mutual TLS: a plaintext client, a client without a certificate and one
// whose certificate comes from another CA are all refused before any RPC runs.
// A Dirichlet split over real peer processes: each peer reports its share, the shares cover
// the data exactly once, and they are far from IID.
TEST(FederatedClusterTest, EachPeerReportsItsDirichletShareAndTrainsOnIt) {
  Cluster cluster(TempDir());
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  // The aggregator registers before the peers say Hello: each measures its round trip to it.
  absl::StatusOr<cv1::ListNodesResponse> nodes;
  const absl::Time registered_by = absl::Now() + absl::Seconds(30);
  while (absl::Now() < registered_by &&
         !((nodes = cluster.Nodes()).ok() && nodes->aggregators_size() == 1)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(nodes.ok() && nodes->aggregators_size() == 1) << cluster.LogTails();
  const std::string aggregator = nodes->aggregators(0).address();
  {
    absl::Status started = cluster.StartPeers(0, 3, 3);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(30)).ok());
  // Every node reported its capacity, and the coordinator could dial each one back (mutual
  // TLS, its own client certificate).
  const absl::Time dialed_by = absl::Now() + absl::Seconds(30);
  auto all_dialed = [](const cv1::ListNodesResponse& n) {
    if (n.peers_size() != 3 || n.aggregators_size() != 1) return false;
    for (const auto* list : {&n.peers(), &n.aggregators()}) {
      for (const cv1::NodeInfo& node : *list) {
        if (node.capacity().reachability() == common::v1::REACHABILITY_UNKNOWN) return false;
      }
    }
    return true;
  };
  while (absl::Now() < dialed_by && !((nodes = cluster.Nodes()).ok() && all_dialed(*nodes))) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_TRUE(all_dialed(*nodes)) << nodes->ShortDebugString();
  for (const auto* list : {&nodes->peers(), &nodes->aggregators()}) {
    for (const cv1::NodeInfo& node : *list) {
      const common::v1::Capacity& c = node.capacity();
      EXPECT_EQ(c.reachability(), common::v1::REACHABILITY_REACHABLE) << node.id();
      EXPECT_GE(c.cpu_cores(), 1u) << node.id();
      EXPECT_GT(c.matmul_gflops(), 0.0) << node.id();
      EXPECT_GT(c.memory_bytes(), 0u) << node.id();
      EXPECT_GT(c.upload_bytes_per_second(), 0.0) << node.id();
      EXPECT_EQ(c.upload_probe_bytes(), uint64_t{4} << 20) << node.id();
    }
  }
  for (const cv1::NodeInfo& peer : nodes->peers()) {
    const auto& rtts = peer.capacity().aggregator_rtts();
    ASSERT_EQ(rtts.size(), 1) << peer.ShortDebugString();
    EXPECT_EQ(rtts[0].address(), aggregator);
    EXPECT_GT(rtts[0].rtt_us(), 0u);
    EXPECT_LT(rtts[0].rtt_us(), 1'000'000u) << "measured within the 1 s bound";
  }
  common::v1::TaskSpec spec = SmallTask("fmnist-dirichlet");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_DIRICHLET);
  spec.mutable_dataset()->set_alpha(0.3);
  spec.set_rounds(2);
  spec.set_min_participants(3);
  // Updates travel as top-k 1% with int8 values (the aggregator decodes and checks them).
  spec.set_compression(common::v1::COMPRESSION_TOPK);
  spec.set_topk_ratio(0.01);
  spec.set_topk_values(common::v1::COMPRESSION_INT8);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(3), "task completion");
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();

  ASSERT_EQ(status->data_size(), 3) << status->ShortDebugString();
  uint64_t train = 0, test = 0;
  std::vector<uint64_t> per_class(10, 0);
  double largest_share = 0;
  for (const cv1::PeerData& d : status->data()) {
    ASSERT_EQ(d.label_histogram_size(), 10) << d.peer_id();
    uint64_t sum = 0, largest = 0;
    for (int c = 0; c < 10; ++c) {
      sum += d.label_histogram(c);
      per_class[c] += d.label_histogram(c);
      largest = std::max(largest, d.label_histogram(c));
    }
    EXPECT_EQ(sum, d.train_samples()) << d.peer_id();
    train += d.train_samples();
    test += d.test_samples();
    largest_share = std::max(largest_share, static_cast<double>(largest) / sum);
  }
  EXPECT_EQ(train, spec.dataset().train_limit());  // every sample in exactly one shard
  EXPECT_EQ(test, spec.dataset().test_limit());
  for (int c = 0; c < 10; ++c) EXPECT_GT(per_class[c], 0u) << "class " << c;
  EXPECT_GT(largest_share, 0.3) << "an IID shard would hold about 0.1 of each class";
  ASSERT_EQ(status->history_size(), 2);
  // Each contributor's time from the round's open to its accepted update is kept (all of them
  // when the round closed because every update was in; one accepted just as a deadline closed
  // the round may have no time yet).
  // Every peer pushed over 100x fewer bytes than its updates' float32 size.
  for (int i = 0; i < 3; ++i) {
    auto metrics = HttpGet(cluster.peer(i).metrics_address, "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    const double sent = MetricValue(*metrics, "shoal_peer_update_bytes_sent_total");
    const double raw = MetricValue(*metrics, "shoal_peer_update_bytes_raw_total");
    EXPECT_GT(sent, 0) << "peer-" << i;
    EXPECT_GE(raw, 100 * sent) << "peer-" << i;
  }
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_GE(r.participants_size(), 1) << r.ShortDebugString();
    EXPECT_GE(r.peer_times_size(), 1) << r.ShortDebugString();
    EXPECT_LE(r.peer_times_size(), r.participants_size()) << r.ShortDebugString();
    for (const cv1::PeerRoundTime& t : r.peer_times()) {
      EXPECT_GT(t.ms(), 0) << t.peer_id();
      EXPECT_LE(t.ms(), r.duration_ms()) << t.peer_id();
    }
  }
}

TEST(FederatedClusterTest, UntrustedClientsAreRefused) {
  Cluster cluster(TempDir());
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  const std::string other_ca = cluster.dir() + "/other-ca";
  process::ProcessOptions gen;
  gen.name = "gen-certs";
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  gen.binary = std::string(bin != nullptr ? bin : "build/bin") + "/shoal-gen-certs";
  gen.args = {other_ca, "intruder"};
  auto proc = process::Process::Start(std::move(gen));
  ASSERT_TRUE(proc.ok()) << proc.status();
  ASSERT_TRUE((*proc)->Wait(absl::Seconds(30)).ok());

  auto list = [&](std::shared_ptr<grpc::ChannelCredentials> credentials) {
    auto stub = cv1::ControlService::NewStub(
        rpc::MakeChannel(cluster.coordinator().address, std::move(credentials)));
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(5));
    cv1::ListTasksResponse response;
    return stub->ListTasks(&context, cv1::ListTasksRequest(), &response).error_code();
  };
  EXPECT_EQ(list(cluster.ClientCredentials()), grpc::StatusCode::OK);
  EXPECT_EQ(list(grpc::InsecureChannelCredentials()), grpc::StatusCode::UNAVAILABLE);

  auto own = rpc::LoadTlsFiles(cluster.ClientTlsDir());
  ASSERT_TRUE(own.ok()) << own.status();
  grpc::SslCredentialsOptions no_client_cert;
  no_client_cert.pem_root_certs = own->ca;
  EXPECT_EQ(list(grpc::SslCredentials(no_client_cert)), grpc::StatusCode::UNAVAILABLE);

  auto foreign = rpc::LoadTlsFiles(other_ca + "/intruder");
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  grpc::SslCredentialsOptions other_ca_cert;
  other_ca_cert.pem_root_certs = own->ca;  // trusts the server, but is not trusted by it
  other_ca_cert.pem_private_key = foreign->key;
  other_ca_cert.pem_cert_chain = foreign->cert;
  EXPECT_EQ(list(grpc::SslCredentials(other_ca_cert)), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace shoal::testing
