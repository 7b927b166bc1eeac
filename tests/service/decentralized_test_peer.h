#pragma once

// What the DecentralizedRunner tests share: a peer (real Trainer on a slice of Fashion-MNIST, a
// real PeerService on 127.0.0.1:0, a PeerClient and the runner), the task they run, and a fixture
// that plays the coordinator's events.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/rpc/server.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/snapshot_store.h"
#include "tests/peer_testing/byzantine.h"

namespace shoal::peer {

// What the tests read of a DecentralizedRunner that production never asks for (its friend).
class DecentralizedRunnerProbe {
 public:
  // The completed round of the model the runner holds, and that model.
  static uint64_t ModelRound(const DecentralizedRunner& runner) { return runner.model_round_; }
  static const tensor::FlatModel& Held(const DecentralizedRunner& runner) { return *runner.held_; }
  // The storage of the model-sized buffers the runner keeps for reuse (still kept after).
  static std::set<const float*> KeptModelStorage(const DecentralizedRunner& runner) {
    std::vector<std::vector<float>> taken;
    for (std::vector<float> b = runner.model_buffers_->Take(); b.capacity() > 0;
         b = runner.model_buffers_->Take()) {
      taken.push_back(std::move(b));
    }
    std::set<const float*> storage;
    for (std::vector<float>& b : taken) {
      storage.insert(b.data());
      runner.model_buffers_->Give(std::move(b));
    }
    return storage;
  }
  // Tops the runner's kept buffers up to `count` buffers of `values` floats each (a pool of
  // fewer keeps fewer).
  static void KeepModelBuffers(const DecentralizedRunner& runner, size_t count, size_t values) {
    for (size_t i = runner.model_buffers_->kept(); i < count; ++i) {
      runner.model_buffers_->Give(std::vector<float>(values));
    }
  }
};

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;
using shoal::testing::ByzantineFault;

inline constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

inline common::v1::TaskSpec Spec() {
  common::v1::TaskSpec spec;
  spec.set_name("dec");
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_model("mlp");
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.mutable_dataset()->set_train_limit(3000);
  spec.mutable_dataset()->set_test_limit(300);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_round_batches(5);
  spec.set_rounds(3);
  spec.set_min_participants(2);
  spec.set_seed(11);
  return spec;
}

// A PeerClient that passes every call on, and once Gate(n) is called counts the round-update
// fetches in flight: each waits (at most 10 s) until another is in flight too or it is the
// n-th, so that the most the runner runs at once is what the count shows. It also lists the
// addresses of those fetches in the order they started.
class GatedPeerClient final : public PeerClient {
 public:
  explicit GatedPeerClient(PeerClient& inner) : inner_(inner) {}

  void Gate(size_t fetches) {
    absl::MutexLock lock(&mu_);
    gated_ = fetches;
  }
  size_t max_in_flight() {
    absl::MutexLock lock(&mu_);
    return max_in_flight_;
  }
  std::vector<std::string> started_addresses() {
    absl::MutexLock lock(&mu_);
    return started_addresses_;
  }

  absl::StatusOr<tensor::ReceivedModel> Fetch(const std::string& address,
                                              const peer::v1::GetSnapshotRequest& request,
                                              absl::Time deadline,
                                              const tensor::ModelLayout& expected,
                                              CallCanceller* canceller,
                                              std::vector<float> buffer) override {
    const bool gated = request.kind() == peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
    if (gated) {
      absl::MutexLock lock(&mu_);
      if (gated_ > 0) {
        ++in_flight_;
        ++started_;
        started_addresses_.push_back(address);
        max_in_flight_ = std::max(max_in_flight_, in_flight_);
        auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return in_flight_ >= 2 || started_ >= gated_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&go), absl::Seconds(10));
      }
    }
    absl::StatusOr<tensor::ReceivedModel> got =
        inner_.Fetch(address, request, deadline, expected, canceller, std::move(buffer));
    if (gated) {
      absl::MutexLock lock(&mu_);
      if (gated_ > 0) --in_flight_;
    }
    return got;
  }
  absl::Status Probe(const std::string& address, const peer::v1::ProbeRequest& request,
                     absl::Time deadline, CallCanceller* canceller) override {
    return inner_.Probe(address, request, deadline, canceller);
  }
  void Forget(const std::string& address) override { inner_.Forget(address); }

 private:
  PeerClient& inner_;
  absl::Mutex mu_;
  size_t gated_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t started_ ABSL_GUARDED_BY(mu_) = 0;
  size_t max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> started_addresses_ ABSL_GUARDED_BY(mu_);
};

// One peer: trainer, snapshot store, PeerService, client and runner.
class TestPeer {
 public:
  TestPeer(const std::string& id, int shard, int shards, const training::RawDataset& train,
           const training::RawDataset& test, ByzantineFault byzantine = {},
           const common::v1::TaskSpec& spec = Spec(), const std::string& state_dir = "",
           int64_t task_created_unix_ms = 0, DecentralizedRunnerOptions runner_options = {},
           double measured_upload = 0)
      : id_(id), metrics_(registry_), client_(nullptr, &metrics_) {
    training::TrainerOptions options;
    options.spec = spec;
    options.shard =
        training::ShardSpec{static_cast<uint32_t>(shard), static_cast<uint32_t>(shards)};
    auto trainer = training::Trainer::Create(options, train, test);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    trainer_ = *std::move(trainer);
    PeerServiceOptions service_options;
    service_options.peer_id = [id] { return id; };
    service_ = std::make_unique<PeerServiceImpl>(store_, metrics_, service_options);
    rpc::ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    server_options.service_name = id;
    auto server = rpc::Server::Start(server_options, {service_.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);

    ModeRunnerDeps deps;
    *deps.assigned.mutable_spec() = spec;
    deps.assigned.set_created_unix_ms(task_created_unix_ms);
    deps.state_dir = state_dir;
    deps.trainer = trainer_.get();
    deps.snapshots = &store_;
    deps.peers = &gated_;
    deps.metrics = &metrics_;
    deps.clock = &RealClock::Get();
    deps.wakeup = &wakeup_;
    deps.peer_id = id;
    deps.update_hooks = byzantine.Hooks();
    deps.measured_upload = std::make_shared<const std::atomic<double>>(measured_upload);
    deps.send = [this](const PeerMessage& m) {
      absl::MutexLock lock(&mu_);
      sent_.push_back(m);
    };
    runner_options.probe_timeout = absl::Milliseconds(500);
    runner_options.probe_attempts = 1;
    auto runner = DecentralizedRunner::Create(std::move(deps), runner_options);
    EXPECT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }
  ~TestPeer() { server_->Shutdown(absl::Seconds(1)); }

  // As the agent does: the runner sees the event as it arrives (Intercept), then handles it.
  void Handle(const CoordinatorEvent& e) {
    if (!runner_->Intercept(e)) runner_->Handle(e, [] { return true; });
  }
  // As if a newer superseding event (e.g. the next RoundOpen) were already queued.
  void HandleSuperseded(const CoordinatorEvent& e) {
    if (!runner_->Intercept(e)) runner_->Handle(e, [] { return false; });
  }
  training::Trainer& trainer() { return *trainer_; }
  // Messages sent since the last call.
  std::vector<PeerMessage> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<PeerMessage> out;
    out.swap(sent_);
    return out;
  }
  coordinator::v1::PeerEndpoint Endpoint() const {
    coordinator::v1::PeerEndpoint e;
    e.set_peer_id(id_);
    e.set_address(server_->address());
    return e;
  }

  DecentralizedRunner& runner() { return *runner_; }
  SnapshotStore& store() { return store_; }
  PeerMetrics& metrics() { return metrics_; }
  GatedPeerClient& gated() { return gated_; }

 private:
  std::string id_;
  prometheus::Registry registry_;
  PeerMetrics metrics_;
  GrpcPeerClient client_;
  GatedPeerClient gated_{client_};
  SnapshotStore store_;
  std::unique_ptr<training::Trainer> trainer_;
  std::unique_ptr<PeerServiceImpl> service_;
  std::unique_ptr<rpc::Server> server_;
  rpc::Wakeup wakeup_{RealClock::Get()};
  std::unique_ptr<DecentralizedRunner> runner_;
  absl::Mutex mu_;
  std::vector<PeerMessage> sent_ ABSL_GUARDED_BY(mu_);
};

inline const PeerMessage* Find(const std::vector<PeerMessage>& ms, PeerMessage::KindCase kind) {
  for (const PeerMessage& m : ms) {
    if (m.kind_case() == kind) return &m;
  }
  return nullptr;
}

// The coordinator's events the tests play.
inline CoordinatorEvent RoundOpen(uint64_t round, uint64_t offer = 0) {
  CoordinatorEvent e;
  e.set_task("dec");
  e.mutable_round_open()->set_round(round);
  e.mutable_round_open()->set_round_batches(5);
  e.mutable_round_open()->set_offer(offer);
  return e;
}
inline CoordinatorEvent JoinRefused(uint64_t round, uint64_t offer = 0) {
  CoordinatorEvent e;
  e.set_task("dec");
  e.mutable_join_refused()->set_round(round);
  e.mutable_join_refused()->set_reason("joins closed at the first ready; wait for the next round");
  e.mutable_join_refused()->set_offer(offer);
  return e;
}
inline CoordinatorEvent PeerList(uint64_t round, uint32_t attempt,
                                 const std::vector<coordinator::v1::PeerEndpoint>& peers,
                                 bool sharing = false) {
  CoordinatorEvent e;
  auto* l = e.mutable_peer_list();
  e.set_task("dec");
  l->set_round(round);
  l->set_attempt(attempt);
  l->set_sharing(sharing);
  for (const auto& p : peers) *l->add_participants() = p;
  return e;
}
inline CoordinatorEvent StartSharing(uint64_t round, uint32_t attempt) {
  CoordinatorEvent e;
  e.set_task("dec");
  e.mutable_start_sharing()->set_round(round);
  e.mutable_start_sharing()->set_attempt(attempt);
  return e;
}

class DecentralizedRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto train = training::LoadFashionMnist(kDataDir, training::Split::kTrain, 3000);
    ASSERT_TRUE(train.ok()) << train.status();
    auto test = training::LoadFashionMnist(kDataDir, training::Split::kTest, 300);
    ASSERT_TRUE(test.ok()) << test.status();
    train_ = new training::RawDataset(*std::move(train));
    test_ = new training::RawDataset(*std::move(test));
  }
  // Freed with the suite (scripts/test --asan runs LeakSanitizer).
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
    train_ = nullptr;
    test_ = nullptr;
  }

  static inline training::RawDataset* train_ = nullptr;
  static inline training::RawDataset* test_ = nullptr;
};

}  // namespace shoal::peer
