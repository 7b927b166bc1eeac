// shoal-peer against a fake coordinator (SessionService + RegistryService on 127.0.0.1:0) and
// the real aggregator in-process, with real LibTorch and the real Fashion-MNIST data.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/file_digest.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/server.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_server.h"
#include "services/peer_agent/peer_server.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"
#include "shoal/coordinator/v1/registry.grpc.pb.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"
#include "shoal/peer/v1/peer.grpc.pb.h"
#include "tests/service/fake_coordinator.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/wait.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;
using shoal::testing::FakeCoordinator;
using shoal::testing::FakeCoordinatorServer;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";
constexpr absl::Duration kWait = absl::Seconds(60);

common::v1::TaskSpec SmallTask(const std::string& model = "mlp") {
  common::v1::TaskSpec spec;
  spec.set_name("small");
  spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
  spec.set_model(model);
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.mutable_dataset()->set_train_limit(2000);
  spec.mutable_dataset()->set_test_limit(400);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_round_batches(5);
  spec.set_rounds(2);
  spec.set_min_participants(1);
  spec.set_round_deadline_seconds(60);
  spec.set_aggregation(common::v1::AGGREGATION_MEAN);
  spec.set_seed(7);
  return spec;
}

// GET http://HOST:PORT/metrics with a plain socket (HTTP/1.0, so the server closes).
std::string FetchMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  const int port = std::stoi(address.substr(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

int64_t UnixMillisIn(absl::Duration d) { return absl::ToUnixMillis(absl::Now() + d); }

class PeerAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = std::make_unique<FakeCoordinatorServer>();
    ASSERT_TRUE(coordinator_->server);
    aggregator::AggregatorOptions agg;
    agg.tls.insecure = true;
    agg.listen = "127.0.0.1:0";
    agg.metrics_listen = "127.0.0.1:0";
    agg.coordinator = coordinator_->address();
    auto a = aggregator::AggregatorServer::Start(agg);
    ASSERT_TRUE(a.ok()) << a.status();
    aggregator_ = *std::move(a);
    agg_stub_ =
        aggregator::v1::AggregatorService::NewStub(rpc::MakeChannel(aggregator_->address()));
  }

  void TearDown() override {
    peer_.reset();
    if (aggregator_) aggregator_->Shutdown();
  }

  PeerOptions Options(const std::string& name = "peer-a") {
    PeerOptions o;
    o.tls.insecure = true;
    o.coordinator = coordinator_->address();
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.data_dir = kDataDir;
    o.shard = {0, 2};
    o.name = name;
    return o;
  }

  void StartPeer() {
    auto p = PeerServer::Start(Options());
    ASSERT_TRUE(p.ok()) << p.status();
    peer_ = *std::move(p);
  }

  FakeCoordinator& fake() { return coordinator_->service; }

  void SendEvent(const CoordinatorEvent& e) { ASSERT_TRUE(fake().Write(e)); }

  void Assign(const common::v1::TaskSpec& spec, const std::string& aggregator_address = "") {
    CoordinatorEvent e;
    e.set_task(spec.name());
    *e.mutable_task_assigned()->mutable_spec() = spec;
    e.mutable_task_assigned()->set_aggregator_address(
        aggregator_address.empty() ? aggregator_->address() : aggregator_address);
    SendEvent(e);
  }

  void InitializeModel(const std::string& task) {
    CoordinatorEvent init;
    init.set_task(task);
    init.mutable_initialize_model();
    SendEvent(init);
  }

  // At the test's aggregator, or at `stub`'s.
  void OpenRound(const std::string& task, uint64_t round, uint64_t base,
                 aggregator::v1::AggregatorService::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    aggregator::v1::OpenRoundRequest req;
    req.set_task(task);
    req.set_round(round);
    req.set_base_version(base);
    req.add_expected_peers("peer-a");
    aggregator::v1::OpenRoundResponse resp;
    grpc::Status s = (stub != nullptr ? stub : agg_stub_.get())->OpenRound(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // Waits until the aggregator accepted `peer`'s update for `round`, as the coordinator learns
  // it: from the aggregator's WatchTask stream.
  ::testing::AssertionResult WaitAccepted(const std::string& task, uint64_t round,
                                          const std::string& peer,
                                          aggregator::v1::AggregatorService::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    aggregator::v1::WatchTaskRequest req;
    req.set_task(task);
    auto reader = (stub != nullptr ? stub : agg_stub_.get())->WatchTask(&ctx, req);
    aggregator::v1::TaskEvent e;
    bool seen = false;
    while (!seen && reader->Read(&e)) {
      const auto& accepted = e.started().accepted();
      seen = (e.has_started() && e.started().open_round() == round &&
              std::find(accepted.begin(), accepted.end(), peer) != accepted.end()) ||
             (e.has_push_accepted() && e.push_accepted().round() == round &&
              e.push_accepted().peer_id() == peer);
    }
    ctx.TryCancel();
    grpc::Status s = reader->Finish();
    if (seen) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "no PushAccepted for " << peer << " in round " << round << ": " << s.error_message();
  }

  aggregator::v1::CloseRoundResponse CloseRound(
      const std::string& task, uint64_t round,
      aggregator::v1::AggregatorService::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    aggregator::v1::CloseRoundRequest req;
    req.set_task(task);
    req.set_round(round);
    aggregator::v1::CloseRoundResponse resp;
    grpc::Status s = (stub != nullptr ? stub : agg_stub_.get())->CloseRound(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  void StartRound(const std::string& task, uint64_t round, uint64_t version, uint32_t batches) {
    CoordinatorEvent e;
    auto* r = e.mutable_round_started();
    e.set_task(task);
    r->set_round(round);
    r->set_model_version(version);
    r->set_round_batches(batches);
    r->set_deadline_unix_ms(UnixMillisIn(absl::Seconds(120)));
    SendEvent(e);
  }

  std::unique_ptr<FakeCoordinatorServer> coordinator_;
  std::unique_ptr<aggregator::AggregatorServer> aggregator_;
  std::unique_ptr<aggregator::v1::AggregatorService::Stub> agg_stub_;
  std::unique_ptr<PeerServer> peer_;
};

TEST_F(PeerAgentTest, RunsOneTaskThroughTheWholeProtocol) {
  StartPeer();
  auto hello = fake().WaitHello(1, kWait);
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->name(), "peer-a");
  EXPECT_EQ(hello->shard_index(), 0u);
  EXPECT_EQ(hello->shard_count(), 2u);
  EXPECT_EQ(hello->device(), "cpu");
  EXPECT_EQ(hello->listen_address(), peer_->address());

  const common::v1::TaskSpec spec = SmallTask();
  Assign(spec);
  CoordinatorEvent init;
  init.set_task("small");
  init.mutable_initialize_model();
  SendEvent(init);
  auto initialized = fake().Take(PeerMessage::kModelInitialized, kWait);
  ASSERT_TRUE(initialized);
  EXPECT_EQ(initialized->task(), "small");

  // The uploaded model is the seed's model: build it here too and compare digests.
  training::TrainerOptions local;
  local.spec = spec;
  local.shard = {1, 2};
  local.data_dir = kDataDir;
  auto trainer = training::Trainer::Create(local);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto expected = (*trainer)->InitialParameters();
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(initialized->model_initialized().digest_xxh3(), expected->Digest());

  // On assignment it told the coordinator what it trains on: shard 0/2's counts per class.
  auto data = fake().Take(PeerMessage::kDataReport, kWait);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->task(), "small");
  local.shard = {0, 2};
  auto same_shard = training::Trainer::Create(local);
  ASSERT_TRUE(same_shard.ok()) << same_shard.status();
  EXPECT_EQ(data->data_report().train_samples(), (*same_shard)->train_size());
  EXPECT_EQ(data->data_report().test_samples(), (*same_shard)->test_size());
  EXPECT_THAT(data->data_report().label_histogram(),
              ElementsAreArray((*same_shard)->label_histogram()));

  // Round 1: the peer trains round_batches batches and pushes its delta.
  OpenRound("small", 1, 0);
  StartRound("small", 1, 0, 5);
  ASSERT_TRUE(WaitAccepted("small", 1, "peer-a"));

  aggregator::v1::CloseRoundResponse closed = CloseRound("small", 1);
  EXPECT_EQ(closed.version(), 1u);
  EXPECT_THAT(closed.contributors(), ::testing::ElementsAre("peer-a"));
  EXPECT_EQ(closed.num_samples(), 80u);

  CoordinatorEvent published;
  published.set_task("small");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  SendEvent(published);
  auto report = fake().Take(PeerMessage::kEvalReport, kWait);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->task(), "small");
  EXPECT_EQ(report->eval_report().version(), 1u);
  EXPECT_EQ(report->eval_report().total(), 200u);  // test_limit 400, slice 0 of 2
  EXPECT_LE(report->eval_report().correct(), 200u);
  EXPECT_GT(report->eval_report().loss_sum(), 0.0);

  // PeerService serves the latest snapshot: the evaluated global model, version 1.
  auto peer_stub = shoal::peer::v1::PeerService::NewStub(rpc::MakeChannel(peer_->address()));
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    shoal::peer::v1::GetSnapshotRequest req;
    req.set_task("small");
    auto reader = peer_stub->GetSnapshot(&ctx, req);
    auto snapshot = rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &ctx);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_EQ(snapshot->meta.version(), 1u);
    EXPECT_TRUE(snapshot->model.layout == expected->layout);
  }
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    shoal::peer::v1::GetSnapshotRequest req;
    req.set_task("other-task");
    auto reader = peer_stub->GetSnapshot(&ctx, req);
    auto snapshot = rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &ctx);
    EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kNotFound);
  }

  // Round 2 trains from version 1 (already held: no download needed, same result).
  OpenRound("small", 2, 1);
  StartRound("small", 2, 1, 3);
  ASSERT_TRUE(WaitAccepted("small", 2, "peer-a"));
  closed = CloseRound("small", 2);
  EXPECT_EQ(closed.version(), 2u);
  EXPECT_EQ(closed.num_samples(), 3u * 16u);

  CoordinatorEvent finished;
  finished.set_task("small");
  finished.mutable_task_finished()->set_state("completed");
  finished.mutable_task_finished()->set_final_version(2);
  SendEvent(finished);

  EXPECT_TRUE(fake().WaitHeartbeats(2, kWait));
  EXPECT_FALSE(fake().Take(PeerMessage::kError, absl::ZeroDuration()));

  // The aggregator has the push before the peer has its answer: the round counts once the
  // peer's call returns.
  std::string metrics;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        metrics = FetchMetrics(peer_->metrics_address());
        return absl::StrContains(metrics, "shoal_peer_round_duration_seconds_count 2") &&
               absl::StrContains(metrics, "shoal_peer_rounds_completed_total 2");
      },
      kWait, absl::Milliseconds(20)))
      << metrics;
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_rounds_completed_total 2"));
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_samples_trained_total 128"));
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_connected 1"));
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_round_duration_seconds_count 2"));
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_updates_rejected_total 0"));
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_test_accuracy "));
  EXPECT_THAT(metrics, HasSubstr("shoal_peer_bytes_received_total"));

  // Shutdown says Leave and closes the stream.
  peer_->Shutdown();
  auto leave = fake().Take(PeerMessage::kLeave, kWait);
  ASSERT_TRUE(leave);
  EXPECT_TRUE(fake().WaitSessionClosed(kWait));
}

TEST_F(PeerAgentTest, NewerRoundAbandonsTheCurrentOne) {
  StartPeer();
  ASSERT_TRUE(fake().WaitHello(1, kWait));
  Assign(SmallTask());
  CoordinatorEvent init;
  init.set_task("small");
  init.mutable_initialize_model();
  SendEvent(init);
  ASSERT_TRUE(fake().Take(PeerMessage::kModelInitialized, kWait));

  // Round 1 asks for far more batches than the test will wait for; round 2 supersedes it.
  OpenRound("small", 1, 0);
  StartRound("small", 1, 0, 1000000);
  CloseRound("small", 1);  // nobody pushed: version stays 0
  OpenRound("small", 2, 0);
  StartRound("small", 2, 0, 2);
  ASSERT_TRUE(WaitAccepted("small", 2, "peer-a"));
  aggregator::v1::CloseRoundResponse closed = CloseRound("small", 2);
  EXPECT_EQ(closed.num_samples(), 32u) << "round 2's 2 batches, nothing of round 1";
}

// The coordinator moves a task to another aggregator after the first one died: it sends the same
// TaskAssigned with the new address, and every later call of the peer goes there.
TEST_F(PeerAgentTest, ReassignmentToAnotherAggregatorMovesEveryFollowingCall) {
  aggregator::AggregatorOptions agg;
  agg.tls.insecure = true;
  agg.listen = "127.0.0.1:0";
  agg.metrics_listen = "127.0.0.1:0";
  agg.coordinator = coordinator_->address();
  auto started = aggregator::AggregatorServer::Start(agg);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<aggregator::AggregatorServer> second = *std::move(started);
  auto second_stub =
      aggregator::v1::AggregatorService::NewStub(rpc::MakeChannel(second->address()));

  StartPeer();
  ASSERT_TRUE(fake().WaitHello(1, kWait));
  const common::v1::TaskSpec spec = SmallTask();
  Assign(spec);
  InitializeModel("small");
  ASSERT_TRUE(fake().Take(PeerMessage::kModelInitialized, kWait));

  aggregator_->Shutdown();  // the first aggregator dies
  Assign(spec, second->address());
  InitializeModel("small");  // PutModel: only the second aggregator can take it
  ASSERT_TRUE(fake().Take(PeerMessage::kModelInitialized, kWait));
  OpenRound("small", 1, 0, second_stub.get());
  StartRound("small", 1, 0, 3);
  ASSERT_TRUE(WaitAccepted("small", 1, "peer-a", second_stub.get()));  // PushUpdate
  aggregator::v1::CloseRoundResponse closed = CloseRound("small", 1, second_stub.get());
  EXPECT_EQ(closed.version(), 1u);
  EXPECT_THAT(closed.contributors(), ::testing::ElementsAre("peer-a"));

  CoordinatorEvent published;
  published.set_task("small");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  SendEvent(published);
  auto report = fake().Take(PeerMessage::kEvalReport, kWait);  // GetModel of version 1
  ASSERT_TRUE(report);
  EXPECT_EQ(report->task(), "small");
  EXPECT_EQ(report->eval_report().version(), 1u);
  EXPECT_FALSE(fake().Take(PeerMessage::kError, absl::ZeroDuration()));
  peer_.reset();
  second->Shutdown();
}

// --advertise: the address the peer gives the coordinator (e.g. behind port forwarding) instead
// of the one it listens on.
TEST_F(PeerAgentTest, HelloCarriesTheAdvertisedAddress) {
  absl::StatusOr<shoal::testing::ReservedPort> port = shoal::testing::ReservedPort::Reserve();
  ASSERT_TRUE(port.ok()) << port.status();
  PeerOptions o = Options();
  o.advertise = port->address();
  auto p = PeerServer::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  peer_ = *std::move(p);
  auto hello = fake().WaitHello(1, kWait);
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->listen_address(), port->address());
  EXPECT_NE(peer_->address(), port->address());
}

TEST_F(PeerAgentTest, ReconnectsWithTheSameIdAfterTheSessionBreaks) {
  StartPeer();
  ASSERT_TRUE(fake().WaitHello(1, kWait));
  fake().DropSession();
  auto again = fake().WaitHello(2, kWait);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->name(), "peer-a");
  EXPECT_EQ(fake().sessions(), 2);
}

TEST_F(PeerAgentTest, ConnectsToACoordinatorThatStartsLater) {
  // Hold a port that refuses connections until the coordinator listens there (a freed port
  // could be handed to a test running beside this one).
  absl::StatusOr<shoal::testing::ReservedPort> port = shoal::testing::ReservedPort::Reserve();
  ASSERT_TRUE(port.ok()) << port.status();
  PeerOptions o = Options();
  o.coordinator = port->address();
  auto p = PeerServer::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  peer_ = *std::move(p);
  // Not a wait for a condition: the test holds for any length; this only gives the peer time
  // to fail a few connection attempts first, so the retry path is the one exercised.
  absl::SleepFor(absl::Milliseconds(500));
  FakeCoordinatorServer late(port->address());
  ASSERT_TRUE(late.server) << "cannot listen on the reserved " << port->address();
  auto hello = late.service.WaitHello(1, kWait);
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->name(), "peer-a");
  peer_.reset();
}

// normalization standardize on a peer's own CSV table: the peer sends the moments of its
// training shard and sets up training only with the federation's statistics, which it then
// uses (TorchScript model of 8 features and 4 classes, exported by deploy/models/export.py).
TEST_F(PeerAgentTest, OwnCsvDataWaitsForTheFederationStatistics) {
  const std::string dir = ::testing::TempDir() + "/fedstats-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream csv(dir + "/train.csv");
    csv << "f0,f1,f2,f3,f4,f5,f6,f7,label\n";
    for (int i = 0; i < 40; ++i) {
      for (int f = 0; f < 8; ++f) csv << (i * (f + 1)) % 13 + 1000 * f << ",";
      csv << i % 4 << "\n";
    }
  }
  PeerOptions o = Options();
  o.data_dir = dir;
  const char* models = std::getenv("SHOAL_TEST_MODELS");
  o.model_dir = models != nullptr ? models : "build/tests/models";
  auto p = PeerServer::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  peer_ = *std::move(p);
  ASSERT_TRUE(fake().WaitHello(1, kWait));

  common::v1::TaskSpec spec = SmallTask();
  spec.set_name("csv");
  spec.set_model("torchscript");
  spec.mutable_torchscript()->set_file("tabular_mlp.pt");
  absl::StatusOr<std::string> digest = Sha256File(o.model_dir + "/tabular_mlp.pt");
  ASSERT_TRUE(digest.ok()) << digest.status();
  spec.mutable_torchscript()->set_sha256(*digest);
  spec.clear_dataset();
  common::v1::DatasetSpec& d = *spec.mutable_dataset();
  d.set_format(common::v1::DATA_FORMAT_CSV);
  d.set_partition(common::v1::PARTITION_IID);
  d.set_train("train.csv");
  d.set_test_fraction(0.2);
  d.set_label_column("label");
  d.set_num_classes(4);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  Assign(spec);

  auto moments = fake().Take(PeerMessage::kDataMoments, kWait);
  ASSERT_TRUE(moments) << "the peer sent no moments";
  EXPECT_EQ(moments->task(), "csv");
  const coordinator::v1::DataMoments& m = moments->data_moments();
  ASSERT_EQ(m.sum_size(), 8);
  ASSERT_EQ(m.sum_squares_size(), 8);
  // Feature 7 is 7000 + something in 1..13: its mean over the shard lies in between.
  EXPECT_GT(m.sum(7) / static_cast<double>(m.count()), 7000.0);
  EXPECT_LT(m.sum(7) / static_cast<double>(m.count()), 7014.0);
  // It waits for the statistics: no data report (it has no trainer) until they come.
  EXPECT_FALSE(fake().Take(PeerMessage::kDataReport, absl::ZeroDuration()));

  CoordinatorEvent stats;
  stats.set_task("csv");
  for (int f = 0; f < 8; ++f) {
    stats.mutable_statistics()->add_mean(1000.0 * f + 7);
    stats.mutable_statistics()->add_std(4);
  }
  stats.mutable_statistics()->set_samples(m.count());
  stats.mutable_statistics()->add_peers("peer-a");
  SendEvent(stats);
  auto data = fake().Take(PeerMessage::kDataReport, kWait);
  ASSERT_TRUE(data) << "no data report after the statistics";
  // The moments covered exactly the shard the trainer trains on (shard 0/2 of 32 rows).
  EXPECT_EQ(data->data_report().train_samples(), m.count());
  EXPECT_FALSE(fake().Take(PeerMessage::kError, absl::ZeroDuration()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal::peer
