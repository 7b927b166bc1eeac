// Whole rounds with 8 peers in one process through the shared fakes (tests/fakes): the real
// CoordinatorCore, real PeerAgents training real LibTorch models on a small synthetic data set,
// and the real AggregatorCore (federated-sync) or the peers' real SnapshotStores (decentralized),
// with no gRPC and no sockets. The coordinator's clock never moves (no deadline or heartbeat can
// fire) and its work runs on manual executors, so a run is decided by the protocol alone.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/task/task_file.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"
#include "services/peer_agent/peer_agent.h"
#include "tests/fakes/in_memory_aggregator.h"
#include "tests/fakes/in_memory_peers.h"
#include "tests/fakes/in_memory_session.h"
#include "tests/fakes/manual_executor.h"
#include "tests/testing/fake_clock.h"

namespace shoal {
namespace {

using shoal::testing::FakeClock;

namespace cv1 = coordinator::v1;

constexpr int kPeers = 8;

// 16 images of 28x28 per peer, labels spread over the 10 classes; a fixed seed.
std::shared_ptr<const training::RawDataset> Synthetic(size_t count, uint32_t seed) {
  auto data = std::make_shared<training::RawDataset>();
  data->count = count;
  data->rows = 28;
  data->cols = 28;
  std::mt19937 rng(seed);
  data->pixels.resize(count * 28 * 28);
  for (auto& p : data->pixels) p = static_cast<uint8_t>(rng() % 256);
  data->labels.resize(count);
  for (size_t i = 0; i < count; ++i) data->labels[i] = static_cast<uint8_t>(i % 10);
  return data;
}

common::v1::TaskSpec Spec(common::v1::Mode mode) {
  common::v1::TaskSpec spec = task::DefaultTaskSpec();
  spec.set_name("in-memory");
  spec.set_mode(mode);
  spec.set_model("mlp");
  spec.set_batch_size(8);
  spec.set_round_batches(2);
  spec.set_rounds(2);
  spec.set_min_participants(kPeers);
  spec.mutable_optimizer()->set_momentum(0);
  task::ApplyTaskDefaults(spec);
  return spec;
}

// A coordinator, an in-memory aggregator and kPeers peer agents, all in this process.
class InMemoryCluster {
 public:
  InMemoryCluster()
      : dir_(std::filesystem::temp_directory_path() /
             absl::StrCat("shoal-in-memory-", ::getpid(), "-",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name())),
        aggregator_(clock_),
        train_(Synthetic(kPeers * 16, 1)),
        test_(Synthetic(kPeers * 8, 2)) {
    std::filesystem::remove_all(dir_);
    store_ = *coordinator::SqliteTaskStore::Open(dir_.string());
    metrics_ = std::make_unique<coordinator::CoordinatorMetrics>(registry_);
    core_ = *coordinator::CoordinatorCore::Create(
        coordinator::CoordinatorOptions{}, *store_, aggregator_,
        coordinator::CoordinatorExecutors{calls_, transfers_, writes_}, clock_, *metrics_);
    for (int i = 0; i < kPeers; ++i) peers_.push_back(std::make_unique<Peer>(*this, i));
  }

  ~InMemoryCluster() {
    for (auto& p : peers_) p->Stop();
    RunWork();
    core_.reset();
    RunWork();
    std::filesystem::remove_all(dir_);
  }

  absl::Status Start(const common::v1::TaskSpec& spec) {
    if (absl::Status s = core_->RegisterAggregator("memory:1"); !s.ok()) return s;
    if (auto created = core_->CreateTask(spec); !created.ok()) return created.status();
    for (auto& p : peers_) {
      if (absl::Status s = p->Connect(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  const fakes::InMemoryPeers& peers_client() const { return peers_client_; }
  absl::Time now() const { return clock_.Now(); }

  // Drives the coordinator (its timers and its aggregator work) until the task has ended or
  // `real_time` has passed; returns the final status.
  cv1::TaskStatus RunToEnd(absl::Duration real_time) {
    const absl::Time give_up = absl::Now() + real_time;
    for (;;) {
      core_->Step();
      RunWork();
      cv1::TaskStatus status = *core_->GetTaskStatus("in-memory");
      if (status.state() != cv1::TASK_STATE_WAITING && status.state() != cv1::TASK_STATE_RUNNING) {
        return status;
      }
      if (absl::Now() > give_up) return status;
      absl::SleepFor(absl::Milliseconds(1));  // the peers' workers run meanwhile
    }
  }

 private:
  struct Peer {
    Peer(InMemoryCluster& c, int index)
        : address(absl::StrCat("memory-peer-", index)),
          metrics(registry),
          session(std::make_shared<fakes::InMemorySession>(*c.core_)) {
      peer::PeerAgentOptions options;
      options.shard = training::ShardSpec{static_cast<uint32_t>(index), kPeers};
      agent = *peer::PeerAgent::Create(
          options, c.train_, c.test_, c.aggregator_, c.peers_client_, snapshots, metrics, c.clock_,
          [s = session](const cv1::PeerMessage& m) { return s->ToCoordinator(m); }, nullptr);
      session->Attach(agent.get());
      c.peers_client_.Register(address, &snapshots);
      hello.set_name(absl::StrCat("p-", index));
      hello.set_listen_address(address);
      hello.set_shard_index(static_cast<uint32_t>(index));
      hello.set_shard_count(kPeers);
    }
    absl::Status Connect() { return session->Connect(hello); }
    void Stop() {
      session->Detach();
      agent->Stop();
    }

    std::string address;
    prometheus::Registry registry;
    peer::PeerMetrics metrics;
    peer::SnapshotStore snapshots;
    std::shared_ptr<fakes::InMemorySession> session;
    std::unique_ptr<peer::PeerAgent> agent;
    cv1::Hello hello;
  };

  void RunWork() {
    while (calls_.RunAll() + transfers_.RunAll() + writes_.RunAll() > 0) {
    }
  }

  std::filesystem::path dir_;
  FakeClock clock_;
  fakes::ManualExecutor calls_, transfers_, writes_;
  fakes::InMemoryAggregator aggregator_;
  fakes::InMemoryPeers peers_client_;
  std::shared_ptr<const training::RawDataset> train_;
  std::shared_ptr<const training::RawDataset> test_;
  prometheus::Registry registry_;
  std::unique_ptr<coordinator::TaskStore> store_;
  std::unique_ptr<coordinator::CoordinatorMetrics> metrics_;
  std::unique_ptr<coordinator::CoordinatorCore> core_;
  std::vector<std::unique_ptr<Peer>> peers_;
};

class InMemoryRoundsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { torch::set_num_threads(1); }
};

TEST_F(InMemoryRoundsTest, FederatedSyncRoundsWithEightPeers) {
  InMemoryCluster cluster;
  ASSERT_TRUE(cluster.Start(Spec(common::v1::MODE_FEDERATED_SYNC)).ok());
  const absl::Time start = absl::Now();
  const cv1::TaskStatus status = cluster.RunToEnd(absl::Seconds(60));
  std::printf("[ figure ] 2 federated-sync rounds of %d in-memory peers: %.3f s\n", kPeers,
              absl::ToDoubleSeconds(absl::Now() - start));
  ASSERT_EQ(status.state(), cv1::TASK_STATE_COMPLETED) << status.ShortDebugString();
  ASSERT_EQ(status.history_size(), 2);
  for (const cv1::RoundSummary& r : status.history()) {
    EXPECT_EQ(r.participants_size(), kPeers) << r.ShortDebugString();
    EXPECT_EQ(r.num_samples(), uint64_t{kPeers} * 2 * 8);
    EXPECT_TRUE(r.evaluation_complete());
    EXPECT_EQ(r.test_samples(), uint64_t{kPeers} * 8) << "every peer evaluated its test slice";
  }
  EXPECT_EQ(status.model_version(), 2u);
}

// Decentralized rounds end bit-identical at every participant, and the same again in a second
// run: the protocol decides the result, not the timing of threads (a peer that trained before
// the round's joins re-opened trains the same batches again: TrainerProgress).
TEST_F(InMemoryRoundsTest, DecentralizedRoundsWithEightPeersAreDeterministic) {
  std::vector<uint64_t> digests;
  for (int run = 0; run < 2; ++run) {
    InMemoryCluster cluster;
    ASSERT_TRUE(cluster.Start(Spec(common::v1::MODE_DECENTRALIZED)).ok());
    const absl::Time start = absl::Now();
    const cv1::TaskStatus status = cluster.RunToEnd(absl::Seconds(60));
    std::printf("[ figure ] 2 decentralized rounds of %d in-memory peers: %.3f s\n", kPeers,
                absl::ToDoubleSeconds(absl::Now() - start));
    ASSERT_EQ(status.state(), cv1::TASK_STATE_COMPLETED) << status.ShortDebugString();
    ASSERT_EQ(status.history_size(), 2);
    for (const cv1::RoundSummary& r : status.history()) {
      EXPECT_EQ(r.participants_size(), kPeers) << r.ShortDebugString();
      EXPECT_NE(r.model_digest(), 0u) << "every participant reported the same digest";
    }
    digests.push_back(status.history(1).model_digest());
    // Each fetch attempt may take the model's bytes at the slowest link (1 Mbit/s) on top of
    // fetch_timeout (the clock stands still here: the deadline is the attempt's whole bound).
    const peer::DecentralizedRunnerOptions defaults;
    const std::vector<fakes::InMemoryPeers::RecordedFetch> fetches =
        cluster.peers_client().fetches();
    ASSERT_FALSE(fetches.empty());
    for (const fakes::InMemoryPeers::RecordedFetch& f : fetches) {
      EXPECT_GE(f.deadline - cluster.now(),
                defaults.fetch_timeout +
                    absl::Seconds(static_cast<double>(f.expected_bytes) / defaults.slowest_link))
          << f.expected_bytes << " bytes";
    }
  }
  EXPECT_EQ(digests[0], digests[1]);
}

}  // namespace
}  // namespace shoal
