// FederatedAsyncRunner against an in-memory aggregator (tests/fakes/peer_side_aggregator.h), no
// gRPC: the push loop and its base versions, the reset to the global model after every push,
// stale refusals, ModelPublished while training, evaluation of the newest version, a move to
// another aggregator, and the test-only slow batch on a fake clock. Real Trainer (LibTorch) on
// a small slice of the real Fashion-MNIST data; a reference trainer with the same options
// replays what the peer should have trained.

#include "services/peer_agent/modes/federated_async/federated_async_runner.h"

#include <prometheus/registry.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/peer_agent.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "tests/fakes/peer_side_aggregator.h"
#include "tests/peer_testing/slow_batch.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/joining_thread.h"

namespace shoal::peer {
namespace {

using shoal::testing::FakeClock;

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;
using fakes::PeerSideAggregator;
using shoal::testing::SlowBatchHook;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";
constexpr uint32_t kBatches = 3;

common::v1::TaskSpec Spec() {
  common::v1::TaskSpec spec;
  spec.set_name("async");
  spec.set_mode(common::v1::MODE_FEDERATED_ASYNC);
  spec.set_model("mlp");
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.mutable_dataset()->set_train_limit(2000);
  spec.mutable_dataset()->set_test_limit(200);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);  // no state: replayable
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.set_round_batches(kBatches);
  spec.set_rounds(10);
  spec.set_min_participants(1);
  spec.set_seed(5);
  return spec;
}

CoordinatorEvent TrainAsync(uint64_t version, uint32_t batches = kBatches) {
  CoordinatorEvent e;
  e.set_task("async");
  e.mutable_train_async()->set_model_version(version);
  e.mutable_train_async()->set_round_batches(batches);
  return e;
}
CoordinatorEvent Published(uint64_t version) {
  CoordinatorEvent e;
  e.set_task("async");
  e.mutable_model_published()->set_round(version);
  e.mutable_model_published()->set_version(version);
  return e;
}
CoordinatorEvent Assigned(const std::string& aggregator) {
  CoordinatorEvent e;
  e.set_task("async");
  *e.mutable_task_assigned()->mutable_spec() = Spec();
  e.mutable_task_assigned()->set_aggregator_address(aggregator);
  return e;
}

std::vector<uint64_t> Versions(const std::vector<PeerSideAggregator::Call>& calls) {
  std::vector<uint64_t> out;
  for (const auto& c : calls) out.push_back(c.version);
  return out;
}
std::vector<uint64_t> EvaluatedVersions(const std::vector<PeerMessage>& sent) {
  std::vector<uint64_t> out;
  for (const PeerMessage& m : sent) {
    if (m.has_eval_report()) out.push_back(m.eval_report().version());
  }
  return out;
}
bool SameBytes(const tensor::FlatModel& a, const tensor::FlatModel& b) {
  return a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}
tensor::FlatModel Shifted(tensor::FlatModel m, float by) {
  for (float& v : m.values) v += by;
  return m;
}

class FederatedAsyncRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto train = training::LoadFashionMnist(kDataDir, training::Split::kTrain, 2000);
    ASSERT_TRUE(train.ok()) << train.status();
    auto test = training::LoadFashionMnist(kDataDir, training::Split::kTest, 200);
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

  // A trainer like the peer's; `after_batch` as TrainerOptions::after_batch.
  static std::unique_ptr<training::Trainer> MakeTrainer(
      std::function<void(const std::function<bool()>&)> after_batch = nullptr) {
    training::TrainerOptions options;
    options.spec = Spec();
    options.shard = training::ShardSpec{0, 2};
    options.after_batch = std::move(after_batch);
    auto trainer = training::Trainer::Create(options, *train_, *test_);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? *std::move(trainer) : nullptr;
  }

  // What a peer that trains kBatches from each of `bases` in turn (resetting to the base every
  // time) pushes: the deltas, replayed on a fresh trainer.
  static std::vector<tensor::FlatModel> ExpectedDeltas(
      const std::vector<const tensor::FlatModel*>& bases) {
    std::unique_ptr<training::Trainer> reference = MakeTrainer();
    std::vector<tensor::FlatModel> out;
    for (const tensor::FlatModel* base : bases) {
      EXPECT_TRUE(reference->SetParameters(*base).ok());
      EXPECT_TRUE(reference->TrainBatches(kBatches, nullptr).ok());
      tensor::FlatModel delta = *reference->GetParameters();
      for (size_t i = 0; i < delta.values.size(); ++i) delta.values[i] -= base->values[i];
      out.push_back(std::move(delta));
    }
    return out;
  }

  static training::RawDataset* train_;
  static training::RawDataset* test_;
};

training::RawDataset* FederatedAsyncRunnerTest::train_ = nullptr;
training::RawDataset* FederatedAsyncRunnerTest::test_ = nullptr;

// One peer's runner, its trainer and what it sent. Handle() runs the loop on the caller's
// thread until Stop() (e.g. from a push hook).
class AsyncPeer {
 public:
  AsyncPeer(PeerSideAggregator& aggregator, std::unique_ptr<training::Trainer> trainer,
            const Clock& clock = RealClock::Get())
      : metrics_(registry_), wakeup_(clock), trainer_(std::move(trainer)) {
    ModeRunnerDeps deps;
    *deps.assigned.mutable_spec() = Spec();
    deps.assigned.set_aggregator_address("aggregator-a:1");
    deps.trainer = trainer_.get();
    deps.snapshots = &store_;
    deps.aggregator = &aggregator;
    deps.metrics = &metrics_;
    deps.clock = &clock;
    deps.wakeup = &wakeup_;
    deps.peer_id = "peer-a";
    deps.session_token = [] { return std::string("token-1"); };
    deps.send = [this](const PeerMessage& m) {
      absl::MutexLock lock(&mu_);
      sent_.push_back(m);
    };
    FederatedAsyncOptions fast;
    fast.retry_backoff = BackoffOptions{absl::Milliseconds(1), absl::Milliseconds(5), 2.0, 0.2};
    fast.retry_wait = absl::Seconds(30);  // every test publishes the version it waits for
    auto runner = FederatedAsyncRunner::Create(std::move(deps), fast);
    EXPECT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    runner_->Start();
  }

  void Handle(const CoordinatorEvent& e) {
    keep_going_ = true;
    runner_->Handle(e, [this] { return keep_going_.load(); });
  }
  // As the session reader thread does before queueing an event.
  bool Intercept(const CoordinatorEvent& e) { return runner_->Intercept(e); }
  void Stop() {
    keep_going_ = false;
    wakeup_.Notify();
  }
  std::vector<PeerMessage> sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  training::Trainer& trainer() { return *trainer_; }
  PeerMetrics& metrics() { return metrics_; }
  ModeRunner& runner() { return *runner_; }
  rpc::Wakeup& wakeup() { return wakeup_; }

 private:
  prometheus::Registry registry_;
  PeerMetrics metrics_;
  SnapshotStore store_;
  rpc::Wakeup wakeup_;
  std::unique_ptr<training::Trainer> trainer_;
  std::unique_ptr<FederatedAsyncRunner> runner_;
  std::atomic<bool> keep_going_{true};
  absl::Mutex mu_;
  std::vector<PeerMessage> sent_ ABSL_GUARDED_BY(mu_);
};

TEST_F(FederatedAsyncRunnerTest, PushesAgainstTheVersionTrainedFromAndResetsToTheGlobalModel) {
  PeerSideAggregator aggregator;
  AsyncPeer peer(aggregator, MakeTrainer());
  const tensor::FlatModel v0 = *peer.trainer().InitialParameters();
  const tensor::FlatModel v1 = Shifted(v0, 0.01f);
  aggregator.Store("aggregator-a:1", 0, v0);
  bool consumed = false;
  aggregator.OnPush([&](const PeerSideAggregator::Push&, size_t index) {
    if (index == 1) {  // the buffer made version 1 out of the second push
      aggregator.Store("aggregator-a:1", 1, v1);
      consumed = peer.Intercept(Published(1));
    }
    if (index == 2) peer.Stop();
  });
  peer.Handle(TrainAsync(0));

  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_EQ(pushes.size(), 3u);
  for (const auto& p : pushes) {
    EXPECT_EQ(p.address, "aggregator-a:1");
    EXPECT_EQ(p.meta.task(), "async");
    EXPECT_EQ(p.meta.round(), 0u);  // the buffer
    EXPECT_EQ(p.meta.peer_id(), "peer-a");
    EXPECT_EQ(p.meta.session_token(), "token-1");
    EXPECT_EQ(p.meta.num_samples(), kBatches * 16u);
  }
  EXPECT_EQ(pushes[0].meta.base_version(), 0u);
  EXPECT_EQ(pushes[1].meta.base_version(), 0u);  // nothing newer yet: version 0 again
  EXPECT_EQ(pushes[2].meta.base_version(), 1u);
  // Version 0 is downloaded once; the second round starts from the copy held.
  EXPECT_THAT(Versions(aggregator.calls("GetModel")), ElementsAre(0, 1));
  // Every delta is relative to the global model it was trained from: the trainer was reset to
  // it after every push (training on from the local model would count updates twice).
  const std::vector<tensor::FlatModel> want = ExpectedDeltas({&v0, &v0, &v1});
  for (size_t i = 0; i < pushes.size(); ++i) {
    EXPECT_TRUE(SameBytes(pushes[i].delta, want[i])) << "push " << i;
  }
  EXPECT_FALSE(SameBytes(want[0], want[1]));  // the data moved on: not the same delta twice
  // The ModelPublished was consumed (never queued to stop the loop) and evaluated once.
  EXPECT_TRUE(consumed);
  EXPECT_FALSE(peer.runner().Supersedes(Published(2)));
  EXPECT_TRUE(peer.runner().Supersedes(TrainAsync(1)));
  EXPECT_THAT(EvaluatedVersions(peer.sent()), ElementsAre(1));
  EXPECT_EQ(peer.sent().size(), 1u);
  EXPECT_EQ(peer.metrics().federated_async.pushes_accepted.Value(), 3);
  EXPECT_EQ(peer.metrics().federated_async.versions_evaluated.Value(), 1);
  EXPECT_EQ(peer.metrics().rounds_abandoned.Value(), 0);
}

TEST_F(FederatedAsyncRunnerTest, AStaleRefusalIsCountedAndTheLoopGoesOnFromTheNewestVersion) {
  PeerSideAggregator aggregator;
  AsyncPeer peer(aggregator, MakeTrainer());
  const tensor::FlatModel v0 = *peer.trainer().InitialParameters();
  aggregator.Store("aggregator-a:1", 0, v0);
  // The first push is too stale; the second is refused once by a busy aggregator (retried).
  aggregator.ScriptPushes({absl::FailedPreconditionError("staleness 3 exceeds max_staleness 2"),
                           absl::UnavailableError("busy")});
  aggregator.OnPush([&](const PeerSideAggregator::Push& push, size_t index) {
    if (index == 0) {  // meanwhile versions 1 and 2 were published
      aggregator.Store("aggregator-a:1", 1, Shifted(v0, 0.5f));
      aggregator.Store("aggregator-a:1", 2, Shifted(v0, 0.01f));
      peer.Intercept(Published(1));
      peer.Intercept(Published(2));
    }
    if (push.status.ok()) peer.Stop();
  });
  peer.Handle(TrainAsync(0));

  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[0].meta.base_version(), 0u);
  EXPECT_EQ(pushes[1].meta.base_version(), 2u);  // the refused update was dropped, not re-pushed
  EXPECT_EQ(pushes[2].meta.base_version(), 2u);  // the retry of the same update
  EXPECT_TRUE(SameBytes(pushes[1].delta, pushes[2].delta));
  // Version 1 was skipped: the loop took the newest, and evaluated only that one.
  EXPECT_THAT(Versions(aggregator.calls("GetModel")), ElementsAre(0, 2));
  EXPECT_THAT(EvaluatedVersions(peer.sent()), ElementsAre(2));
  for (const PeerMessage& m : peer.sent()) EXPECT_FALSE(m.has_error()) << m.DebugString();
  EXPECT_EQ(peer.metrics().federated_async.stale_refusals.Value(), 1);
  EXPECT_EQ(peer.metrics().federated_async.pushes_accepted.Value(), 1);
}

TEST_F(FederatedAsyncRunnerTest, AModelPublishedDuringTrainingDoesNotStopIt) {
  PeerSideAggregator aggregator;
  AsyncPeer* self = nullptr;
  std::atomic<int> batches{0};
  bool consumed = false;
  // After the first batch, the session reader sees version 1 published.
  auto after_batch = [&](const std::function<bool()>&) {
    if (++batches == 1) consumed = self->Intercept(Published(1));
  };
  AsyncPeer peer(aggregator, MakeTrainer(after_batch));
  self = &peer;
  const tensor::FlatModel v0 = *peer.trainer().InitialParameters();
  aggregator.Store("aggregator-a:1", 0, v0);
  aggregator.Store("aggregator-a:1", 1, Shifted(v0, 0.01f));
  aggregator.OnPush([&](const PeerSideAggregator::Push&, size_t index) {
    if (index == 1) peer.Stop();
  });
  peer.Handle(TrainAsync(0));

  EXPECT_TRUE(consumed);
  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  // The round in progress went on to the end and was pushed against the version it started
  // from; the next one started from version 1, after evaluating it.
  EXPECT_EQ(pushes[0].meta.base_version(), 0u);
  EXPECT_EQ(pushes[0].meta.num_samples(), kBatches * 16u);
  EXPECT_EQ(pushes[1].meta.base_version(), 1u);
  EXPECT_EQ(batches.load(), 2 * static_cast<int>(kBatches));
  EXPECT_EQ(peer.metrics().rounds_abandoned.Value(), 0);
  EXPECT_THAT(EvaluatedVersions(peer.sent()), ElementsAre(1));
}

TEST_F(FederatedAsyncRunnerTest, TrainingAgainFromTheVersionJustPushedGivesWayToANewerOne) {
  PeerSideAggregator aggregator;
  AsyncPeer* self = nullptr;
  std::atomic<int> batches{0};
  // One batch into the second stretch (again from version 0: nothing newer was out when
  // the first push ended), version 1 is published.
  auto after_batch = [&](const std::function<bool()>&) {
    if (++batches == static_cast<int>(kBatches) + 1) self->Intercept(Published(1));
  };
  AsyncPeer peer(aggregator, MakeTrainer(after_batch));
  self = &peer;
  const tensor::FlatModel v0 = *peer.trainer().InitialParameters();
  const tensor::FlatModel v1 = Shifted(v0, 0.01f);
  aggregator.Store("aggregator-a:1", 0, v0);
  aggregator.Store("aggregator-a:1", 1, v1);
  aggregator.OnPush([&](const PeerSideAggregator::Push&, size_t index) {
    if (index == 1) peer.Stop();
  });
  peer.Handle(TrainAsync(0));

  // The speculative stretch stopped at once and the next one trained from version 1 in full:
  // no update went out trained from version 0 twice.
  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[0].meta.base_version(), 0u);
  EXPECT_EQ(pushes[1].meta.base_version(), 1u);
  EXPECT_EQ(pushes[1].meta.num_samples(), kBatches * 16u);
  EXPECT_EQ(batches.load(), 2 * static_cast<int>(kBatches) + 1);
  // Its delta is relative to version 1, from which the trainer started afresh: replayed on a
  // fresh trainer (the same batches, the same optimizer state), it matches bit for bit.
  std::unique_ptr<training::Trainer> reference = MakeTrainer();
  ASSERT_TRUE(reference->SetParameters(v0).ok());
  ASSERT_TRUE(reference->TrainBatches(kBatches, nullptr).ok());
  ASSERT_TRUE(reference->SetParameters(v0).ok());
  ASSERT_TRUE(reference->TrainBatches(1, nullptr).ok());
  ASSERT_TRUE(reference->SetParameters(v1).ok());
  ASSERT_TRUE(reference->TrainBatches(kBatches, nullptr).ok());
  tensor::FlatModel want = *reference->GetParameters();
  for (size_t i = 0; i < want.values.size(); ++i) want.values[i] -= v1.values[i];
  EXPECT_TRUE(SameBytes(pushes[1].delta, want));
  EXPECT_EQ(peer.metrics().federated_async.restarts.Value(), 1);
  EXPECT_EQ(peer.metrics().rounds_abandoned.Value(), 0);
  EXPECT_THAT(Versions(aggregator.calls("GetModel")), ElementsAre(0, 1));
  EXPECT_THAT(EvaluatedVersions(peer.sent()), ElementsAre(1));
  for (const PeerMessage& m : peer.sent()) EXPECT_FALSE(m.has_error()) << m.DebugString();
}

TEST_F(FederatedAsyncRunnerTest, AnIdleRunnerQueuesModelPublishedAndEvaluatesTheNewestOnce) {
  PeerSideAggregator aggregator;
  AsyncPeer peer(aggregator, MakeTrainer());
  const tensor::FlatModel v0 = *peer.trainer().InitialParameters();
  aggregator.Store("aggregator-a:1", 3, Shifted(v0, 0.01f));
  // No loop runs: the event is not consumed, so the agent queues it and the worker handles it.
  EXPECT_FALSE(peer.Intercept(Published(2)));
  EXPECT_FALSE(peer.Intercept(Published(3)));
  EXPECT_FALSE(peer.runner().Supersedes(Published(3)));
  peer.Handle(Published(2));
  peer.Handle(Published(3));  // already evaluated: nothing to do
  EXPECT_THAT(Versions(aggregator.calls("GetModel")), ElementsAre(3));
  EXPECT_THAT(EvaluatedVersions(peer.sent()), ElementsAre(3));
  ASSERT_EQ(peer.sent().size(), 1u);
  EXPECT_GT(peer.sent()[0].eval_report().total(), 0u);
}

TEST_F(FederatedAsyncRunnerTest, ReassignmentMovesEveryLaterCallToTheNewAggregator) {
  PeerSideAggregator aggregator;
  AsyncPeer peer(aggregator, MakeTrainer());
  const tensor::FlatModel v0 = *peer.trainer().InitialParameters();
  aggregator.Store("aggregator-a:1", 0, v0);
  aggregator.Store("aggregator-a:1", 6, Shifted(v0, 0.02f));
  // The new aggregator restored the checkpoint of version 5 (it never had version 6).
  aggregator.Store("aggregator-b:2", 5, Shifted(v0, 0.01f));
  aggregator.OnPush([&](const PeerSideAggregator::Push&, size_t) {
    if (aggregator.pushes().size() == 1) peer.Intercept(Published(6));  // the old one's last
    peer.Stop();
  });
  peer.Handle(TrainAsync(0));
  ASSERT_EQ(aggregator.pushes().size(), 1u);

  // The task moved: TaskAssigned with the new address, then TrainAsync from the restored
  // version. The TaskAssigned resumes the loop, but the TrainAsync queued behind it has already
  // stopped it (keep_going false); then the new loop runs against the new aggregator.
  const size_t calls_before = aggregator.calls().size();
  peer.Stop();
  peer.runner().Handle(Assigned("aggregator-b:2"), [] { return false; });
  EXPECT_FALSE(peer.Intercept(TrainAsync(5)));
  peer.Handle(TrainAsync(5));

  const std::vector<PeerSideAggregator::Call> calls = aggregator.calls();
  ASSERT_GT(calls.size(), calls_before);
  for (size_t i = calls_before; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].address, "aggregator-b:2") << calls[i].method;
  }
  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].address, "aggregator-b:2");
  EXPECT_EQ(pushes[1].meta.base_version(), 5u);  // not the old aggregator's version 6
  EXPECT_THAT(Versions(aggregator.calls("GetModel")), ElementsAre(0, 5));
}

TEST_F(FederatedAsyncRunnerTest, ASlowBatchPausesOnTheClockAndStoppingCutsThePauseShort) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  const absl::Duration pause = absl::Minutes(10);
  PeerSideAggregator aggregator;
  aggregator.SetClock(&clock);
  rpc::Wakeup* wakeup = nullptr;  // the peer's, set below
  auto after_batch = [&](const std::function<bool()>& keep_going) {
    (*SlowBatchHook(pause))(*wakeup, keep_going);
  };
  AsyncPeer peer(aggregator, MakeTrainer(after_batch), clock);
  wakeup = &peer.wakeup();
  aggregator.Store("aggregator-a:1", 0, *peer.trainer().InitialParameters());
  testing::JoiningThread worker([&] { peer.Handle(TrainAsync(0, 2)); }, [&] { peer.Stop(); });

  // Move the fake clock on in steps of half a pause until two pushes are in; no real sleeping
  // beyond the short waits for the worker.
  for (int step = 0; step < 10000 && !aggregator.WaitForPushes(2, absl::Milliseconds(2)); ++step) {
    clock.Advance(pause / 2);
    peer.wakeup().Notify();
  }
  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_GE(pushes.size(), 2u);
  // Each push came after its two batches and their two pauses on the clock.
  EXPECT_GE(pushes[0].at - start, 2 * pause);
  EXPECT_GE(pushes[1].at - pushes[0].at, 2 * pause);

  // Stopping is not delayed by a pause: the clock stands still from here on.
  const size_t pushed = aggregator.pushes().size();
  peer.Stop();
  worker.Join();
  EXPECT_LE(aggregator.pushes().size(), pushed + 1);
  EXPECT_EQ(*SlowBatchHook(absl::ZeroDuration()), nullptr);
  EXPECT_FALSE(SlowBatchHook(absl::Milliseconds(-5)).ok());
  EXPECT_FALSE(SlowBatchHook(absl::Hours(2)).ok());
}

// Through the host: the after-batch hook (shoal-peer-testing --test-slow-batch) reaches the trainer
// of a federated-async task (each batch takes an hour on the agent's fake clock), a ModelPublished
// on the session while the peer trains does not stop the round in progress, and Stop() does not
// wait for a pause.
TEST_F(FederatedAsyncRunnerTest, TheAgentPausesAfterEveryBatchAndKeepsTrainingThroughPublished) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  PeerSideAggregator aggregator;
  aggregator.SetClock(&clock);
  const tensor::FlatModel v0 = *MakeTrainer()->InitialParameters();
  aggregator.Store("aggregator-a:1", 0, v0);
  aggregator.Store("aggregator-a:1", 1, Shifted(v0, 0.01f));
  prometheus::Registry registry;
  PeerMetrics metrics(registry);
  GrpcPeerClient peers(nullptr, &metrics);
  SnapshotStore store;
  absl::Mutex mu;
  std::vector<PeerMessage> sent;
  PeerAgentOptions options;
  options.shard = training::ShardSpec{0, 2};
  options.hooks.after_batch = *SlowBatchHook(absl::Hours(1));
  auto agent = PeerAgent::Create(
      options, std::make_shared<const training::RawDataset>(*train_),
      std::make_shared<const training::RawDataset>(*test_), aggregator, peers, store, metrics,
      clock,
      [&](const PeerMessage& m) {
        absl::MutexLock lock(&mu);
        sent.push_back(m);
        return absl::OkStatus();
      },
      nullptr);
  ASSERT_TRUE(agent.ok()) << agent.status();
  CoordinatorEvent welcome;
  welcome.mutable_welcome()->set_peer_id("peer-a");
  welcome.mutable_welcome()->set_session_token("token-1");
  (*agent)->OnEvent(welcome);
  (*agent)->OnEvent(Assigned("aggregator-a:1"));
  (*agent)->OnEvent(TrainAsync(0, 1));

  // Once the loop fetched version 0 it trains: from now on the coordinator announces version 1
  // (again and again: consumed while training, and each wakes the pause to look at the clock)
  // while the clock moves an hour at a time, until the round is pushed.
  ASSERT_TRUE(aggregator.WaitForGets(1, absl::Seconds(60)));
  for (int step = 0; step < 10000 && !aggregator.WaitForPushes(1, absl::Milliseconds(2)); ++step) {
    clock.Advance(absl::Hours(1));
    (*agent)->OnEvent(Published(1));
  }
  std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_GE(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].meta.base_version(), 0u);
  EXPECT_EQ(pushes[0].meta.num_samples(), 16u);  // the whole round: it was not stopped
  EXPECT_EQ(pushes[0].meta.session_token(), "token-1");
  EXPECT_GE(pushes[0].at - start, absl::Hours(1));  // a batch and its pause
  EXPECT_EQ(metrics.rounds_abandoned.Value(), 0);

  // The next round starts from version 1, evaluated first; then the peer pauses after its
  // batch on a clock that no longer moves, and Stop() cuts the pause short.
  ASSERT_TRUE(aggregator.WaitForGets(2, absl::Seconds(60)));
  EXPECT_THAT(Versions(aggregator.calls("GetModel")), ElementsAre(0, 1));
  (*agent)->Stop();
  absl::MutexLock lock(&mu);
  EXPECT_THAT(EvaluatedVersions(sent), ElementsAre(1));
}

}  // namespace
}  // namespace shoal::peer
