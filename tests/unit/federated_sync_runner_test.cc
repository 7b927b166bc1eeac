// FederatedSyncRunner event by event against a fake aggregator (no gRPC): which aggregator each
// call goes to, what it pushes, retries, and the test-only Byzantine fault. Real Trainer
// (LibTorch) on a small slice of the real Fashion-MNIST data.

#include "services/peer_agent/modes/federated_sync/federated_sync_runner.h"

#include <prometheus/registry.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/tensor/spill_file.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_client.h"
#include "services/peer_agent/modes/aggregator_peer.h"
#include "services/peer_agent/modes/federated_sync/background_evaluator.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "tests/fakes/peer_side_aggregator.h"
#include "tests/peer_testing/byzantine.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

common::v1::TaskSpec Spec() {
  common::v1::TaskSpec spec;
  spec.set_name("fed");
  spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
  spec.set_model("mlp");
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.mutable_dataset()->set_train_limit(2000);
  spec.mutable_dataset()->set_test_limit(200);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.set_round_batches(3);
  spec.set_rounds(2);
  spec.set_min_participants(1);
  spec.set_seed(5);
  return spec;
}

using fakes::PeerSideAggregator;
using shoal::testing::ByzantineFault;

// The addresses of the `method` calls since the `from`-th call.
std::vector<std::string> Addresses(const PeerSideAggregator& aggregator, const std::string& method,
                                   size_t from = 0) {
  std::vector<std::string> out;
  const std::vector<PeerSideAggregator::Call> calls = aggregator.calls();
  for (size_t i = from; i < calls.size(); ++i) {
    if (calls[i].method == method) out.push_back(calls[i].address);
  }
  return out;
}

// The deltas of the accepted pushes.
std::vector<tensor::FlatModel> Accepted(const PeerSideAggregator& aggregator) {
  std::vector<tensor::FlatModel> out;
  for (const PeerSideAggregator::Push& p : aggregator.pushes()) {
    if (p.status.ok()) out.push_back(p.delta);
  }
  return out;
}

// One peer's runner with its trainer, store and the messages it sent.
class TestPeer {
 public:
  TestPeer(PeerSideAggregator& aggregator, const training::RawDataset& train,
           const training::RawDataset& test, ByzantineFault byzantine = {},
           FederatedSyncOptions fast = {}, bool evaluate_beside_training = true,
           bool download_against_held = false)
      : metrics_(registry_) {
    training::TrainerOptions options;
    options.spec = Spec();
    options.shard = training::ShardSpec{0, 2};
    auto trainer = training::Trainer::Create(options, train, test);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    trainer_ = *std::move(trainer);
    ModeRunnerDeps deps;
    *deps.assigned.mutable_spec() = Spec();
    deps.assigned.set_aggregator_address("aggregator-a:1");
    deps.trainer = trainer_.get();
    deps.snapshots = &store_;
    deps.aggregator = &aggregator;
    deps.metrics = &metrics_;
    deps.clock = &RealClock::Get();
    deps.wakeup = &wakeup_;
    deps.peer_id = "peer-a";
    deps.session_token = [] { return std::string("token-1"); };
    deps.update_hooks = byzantine.Hooks();
    deps.evaluate_beside_training = evaluate_beside_training;
    deps.download_against_held = download_against_held;
    deps.send = [this](const PeerMessage& m) {
      absl::MutexLock lock(&mu_);
      sent_.push_back(m);
      last_sender_ = std::this_thread::get_id();
    };
    fast.retry_backoff = BackoffOptions{absl::Milliseconds(10), absl::Milliseconds(50), 2.0, 0.2};
    auto runner = FederatedSyncRunner::Create(std::move(deps), fast);
    EXPECT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    runner_->Start();
  }

  void Handle(const CoordinatorEvent& e) {
    runner_->Handle(e, [] { return true; });
  }
  std::vector<PeerMessage> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(sent_, {});
  }
  // The same once at least `n` messages were sent (evaluations are reported from the
  // evaluator's thread), waiting up to 20 s.
  std::vector<PeerMessage> TakeAtLeast(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20));
    return std::exchange(sent_, {});
  }
  // The thread that sent the last message.
  std::thread::id last_sender() {
    absl::MutexLock lock(&mu_);
    return last_sender_;
  }
  ~TestPeer() { runner_.reset(); }  // its evaluator's thread sends into sent_
  training::Trainer& trainer() { return *trainer_; }
  SnapshotStore& store() { return store_; }

 private:
  prometheus::Registry registry_;
  PeerMetrics metrics_;
  SnapshotStore store_;
  rpc::Wakeup wakeup_{RealClock::Get()};
  std::unique_ptr<training::Trainer> trainer_;
  std::unique_ptr<FederatedSyncRunner> runner_;
  absl::Mutex mu_;
  std::vector<PeerMessage> sent_ ABSL_GUARDED_BY(mu_);
  std::thread::id last_sender_ ABSL_GUARDED_BY(mu_);
};

CoordinatorEvent Initialize() {
  CoordinatorEvent e;
  e.set_task("fed");
  e.mutable_initialize_model();
  return e;
}
CoordinatorEvent RoundStarted(uint64_t round, uint64_t version) {
  CoordinatorEvent e;
  e.set_task("fed");
  e.mutable_round_started()->set_round(round);
  e.mutable_round_started()->set_model_version(version);
  e.mutable_round_started()->set_round_batches(3);
  return e;
}
CoordinatorEvent Assigned(const std::string& aggregator) {
  CoordinatorEvent e;
  e.set_task("fed");
  *e.mutable_task_assigned()->mutable_spec() = Spec();
  e.mutable_task_assigned()->set_aggregator_address(aggregator);
  return e;
}

std::vector<PeerMessage::KindCase> Kinds(const std::vector<PeerMessage>& ms) {
  std::vector<PeerMessage::KindCase> out;
  for (const PeerMessage& m : ms) out.push_back(m.kind_case());
  return out;
}

class FederatedSyncRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto train = training::LoadFashionMnist(kDataDir, training::Split::kTrain, 2000);
    ASSERT_TRUE(train.ok()) << train.status();
    auto test = training::LoadFashionMnist(kDataDir, training::Split::kTest, 200);
    ASSERT_TRUE(test.ok()) << test.status();
    train_ = new training::RawDataset(*std::move(train));
    test_ = new training::RawDataset(*std::move(test));
  }
  // GoogleTest sets up and tears down every suite, ByzantineTest (derived) included: without
  // this the second set-up overwrote the first one's data (a leak LeakSanitizer reports).
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
    train_ = nullptr;
    test_ = nullptr;
  }
  static training::RawDataset* train_;
  static training::RawDataset* test_;
};

training::RawDataset* FederatedSyncRunnerTest::train_ = nullptr;
training::RawDataset* FederatedSyncRunnerTest::test_ = nullptr;

TEST_F(FederatedSyncRunnerTest, ReassignmentMovesEveryFollowingCallToTheNewAggregator) {
  PeerSideAggregator aggregator;
  TestPeer peer(aggregator, *train_, *test_);
  peer.Handle(Initialize());
  EXPECT_THAT(Kinds(peer.Take()), ElementsAre(PeerMessage::kModelInitialized));
  EXPECT_THAT(Addresses(aggregator, "PutModel"), ElementsAre("aggregator-a:1"));
  const size_t before_move = aggregator.calls().size();

  // The coordinator moved the task: the same TaskAssigned with another aggregator.
  peer.Handle(Assigned("aggregator-b:2"));
  peer.Handle(RoundStarted(1, 0));
  EXPECT_THAT(Kinds(peer.Take()), IsEmpty());  // the aggregator reports the push
  auto model = peer.trainer().GetParameters();
  ASSERT_TRUE(model.ok());
  aggregator.Store("aggregator-b:2", 1, *model);
  CoordinatorEvent published;
  published.set_task("fed");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  peer.Handle(published);
  EXPECT_THAT(Kinds(peer.TakeAtLeast(1)), ElementsAre(PeerMessage::kEvalReport));
  peer.Handle(Initialize());
  EXPECT_THAT(Kinds(peer.Take()), ElementsAre(PeerMessage::kModelInitialized));

  const std::vector<PeerSideAggregator::Call> calls = aggregator.calls();
  ASSERT_EQ(calls.size(), before_move + 3);  // push, download of version 1, upload
  for (size_t i = before_move; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].address, "aggregator-b:2") << calls[i].method;
  }
}

TEST_F(FederatedSyncRunnerTest, RetriesAnUnavailableAggregatorWithinTheRound) {
  PeerSideAggregator aggregator;
  TestPeer peer(aggregator, *train_, *test_);
  peer.Handle(Initialize());
  peer.Take();
  aggregator.ScriptPushes(
      {absl::UnavailableError("aggregator busy"), absl::UnavailableError("aggregator busy")});
  peer.Handle(RoundStarted(1, 0));
  EXPECT_THAT(Kinds(peer.Take()), IsEmpty());  // the aggregator reports the push
  EXPECT_THAT(Addresses(aggregator, "PushUpdate"),
              ElementsAre("aggregator-a:1", "aggregator-a:1", "aggregator-a:1"));
  EXPECT_EQ(Accepted(aggregator).size(), 1u);
}

// An aggregator that does not run the round (it restarted and lost the task, or the round moved
// elsewhere) is not the peer's failure: nothing is reported, and the next RoundStarted is
// trained as usual. (Soak: a task failed when its aggregator restarted mid-round and each
// remaining peer's push found "unknown task" and reported it; the coordinator counted the
// reports as failed peers.)
TEST_F(FederatedSyncRunnerTest, AnAggregatorThatDoesNotRunTheRoundIsNotThePeersFailure) {
  PeerSideAggregator aggregator;
  TestPeer peer(aggregator, *train_, *test_);
  peer.Handle(Initialize());
  peer.Take();
  aggregator.ScriptPushes({absl::NotFoundError("unknown task 'fed'")});
  peer.Handle(RoundStarted(1, 0));
  EXPECT_THAT(Kinds(peer.Take()), IsEmpty());
  EXPECT_EQ(Accepted(aggregator).size(), 0u);
  peer.Handle(RoundStarted(1, 0));  // the round again, at the task's aggregator
  EXPECT_THAT(Kinds(peer.Take()), IsEmpty());
  EXPECT_EQ(Accepted(aggregator).size(), 1u);
}

// A model or an update over a slow link: each attempt gets rpc_timeout plus its bytes at the
// slowest link, not rpc_timeout alone (which cut a 100 MB model off mid-stream on a 20 Mbit/s
// uplink), and the initial upload's budget grows to one such attempt.
TEST_F(FederatedSyncRunnerTest, TransferAttemptsGetTheirBytesAtTheSlowestLink) {
  PeerSideAggregator aggregator;
  FederatedSyncOptions slow;
  slow.rpc_timeout = absl::Seconds(1);
  slow.model_transfer_budget = absl::Seconds(2);
  slow.slowest_link = 10e3;  // bytes per second: the MLP's 636,040 bytes take 63.6 s
  TestPeer peer(aggregator, *train_, *test_, {}, slow);
  const absl::Duration model_time = absl::Seconds(159010 * 4 / 10e3);
  const absl::Time before = absl::Now();
  peer.Handle(Initialize());
  peer.Handle(RoundStarted(1, 0));  // no deadline: the default round budget (10 min)
  auto model = peer.trainer().GetParameters();
  ASSERT_TRUE(model.ok());
  aggregator.Store("aggregator-a:1", 1, *model);
  CoordinatorEvent published;
  published.set_task("fed");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  peer.Handle(published);
  const absl::Time after = absl::Now();
  const std::vector<PeerSideAggregator::Call> calls = aggregator.calls();
  ASSERT_EQ(calls.size(), 3u);  // the initial model, the push, the published model
  EXPECT_EQ(calls[0].method, "PutModel");
  EXPECT_EQ(calls[1].method, "PushUpdate");
  EXPECT_EQ(calls[2].method, "GetModel");
  for (const PeerSideAggregator::Call& c : calls) {
    // The update is raw float32 here: the model's bytes too.
    EXPECT_GE(c.deadline, before + slow.rpc_timeout + model_time) << c.method;
    EXPECT_LE(c.deadline, after + slow.rpc_timeout + model_time) << c.method;
  }
}

// With --download-against-held a download names the version held; one that does not check out
// that way (here: refused as a digest mismatch would be) is made again raw, and the peer goes on
// with the model it got.
TEST_F(FederatedSyncRunnerTest, DownloadsAgainstTheHeldVersionElseRaw) {
  PeerSideAggregator aggregator;
  TestPeer peer(aggregator, *train_, *test_, {}, {}, /*evaluate_beside_training=*/false,
                /*download_against_held=*/true);
  peer.Handle(Initialize());  // holds version 0, uploaded
  peer.Handle(RoundStarted(1, 0));
  auto model = peer.trainer().GetParameters();
  ASSERT_TRUE(model.ok());
  aggregator.Store("aggregator-a:1", 1, *model);
  aggregator.RefuseAgainstHeld(absl::InvalidArgumentError("tensor 'w': digest mismatch"));
  CoordinatorEvent published;
  published.set_task("fed");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  peer.Handle(published);
  EXPECT_THAT(aggregator.held_asked(), ElementsAre(0, -1));
  EXPECT_EQ(aggregator.calls("GetModel").size(), 1u) << "the raw download";
  EXPECT_THAT(Kinds(peer.TakeAtLeast(1)), Contains(PeerMessage::kEvalReport));
}

// A published model is evaluated on the evaluator's thread while the worker trains the next
// round: the next round trains on the published version at once, and the EvalReport that follows
// carries that version and what the trainer's own evaluation of it gives.
TEST_F(FederatedSyncRunnerTest, TrainsTheNextRoundWhileThePublishedModelIsEvaluated) {
  PeerSideAggregator aggregator;
  TestPeer peer(aggregator, *train_, *test_);
  peer.Handle(Initialize());
  peer.Handle(RoundStarted(1, 0));
  EXPECT_THAT(Kinds(peer.Take()), ElementsAre(PeerMessage::kModelInitialized));
  auto published_model = peer.trainer().GetState(/*include_buffers=*/true);
  ASSERT_TRUE(published_model.ok());
  aggregator.Store("aggregator-a:1", 1, *published_model);
  // What the evaluation of version 1 must report: the trainer's own, before it trains on.
  ASSERT_TRUE(peer.trainer().SetState(*published_model).ok());
  absl::StatusOr<training::EvalStats> want = peer.trainer().Evaluate();
  ASSERT_TRUE(want.ok());

  CoordinatorEvent published;
  published.set_task("fed");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  peer.Handle(published);
  peer.Handle(RoundStarted(2, 1));  // follows the publish at once

  const std::vector<PeerMessage> sent = peer.TakeAtLeast(1);
  ASSERT_THAT(Kinds(sent), ElementsAre(PeerMessage::kEvalReport));
  EXPECT_EQ(sent[0].eval_report().version(), 1u);
  EXPECT_EQ(sent[0].eval_report().correct(), want->correct);
  EXPECT_EQ(sent[0].eval_report().total(), want->total);
  EXPECT_EQ(sent[0].eval_report().loss_sum(), want->loss_sum);
  const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].meta.round(), 2u);
  EXPECT_EQ(pushes[1].meta.base_version(), 1u);
  // Training took the snapshot down (the evaluator kept no reference to its copy).
  EXPECT_FALSE(peer.store().Latest());
}

// With --evaluate-beside-training=false the published model is evaluated before the worker goes
// on: its EvalReport is out and its snapshot up when ModelPublished has been handled, before the
// next round trains. The report is the same as beside training.
TEST_F(FederatedSyncRunnerTest, EvaluatesBeforeTheNextRoundUnlessBesideTraining) {
  std::optional<tensor::FlatModel> model;  // version 1, the same for both peers
  std::vector<PeerMessage> reports;
  for (const bool beside : {false, true}) {
    SCOPED_TRACE(beside ? "beside training" : "before training");
    PeerSideAggregator aggregator;
    TestPeer peer(aggregator, *train_, *test_, {}, {}, beside);
    peer.Handle(Initialize());
    peer.Handle(RoundStarted(1, 0));
    EXPECT_THAT(Kinds(peer.Take()), ElementsAre(PeerMessage::kModelInitialized));
    if (!model) {
      auto state = peer.trainer().GetState(/*include_buffers=*/true);
      ASSERT_TRUE(state.ok());
      model = *std::move(state);
    }
    aggregator.Store("aggregator-a:1", 1, *model);
    CoordinatorEvent published;
    published.set_task("fed");
    published.mutable_model_published()->set_round(1);
    published.mutable_model_published()->set_version(1);
    peer.Handle(published);
    if (!beside) {
      const std::vector<PeerMessage> sent = peer.Take();  // no wait: sent already
      ASSERT_THAT(Kinds(sent), ElementsAre(PeerMessage::kEvalReport));
      EXPECT_EQ(peer.last_sender(), std::this_thread::get_id());  // by the worker, not a thread
      reports.push_back(sent[0]);
      EXPECT_EQ(aggregator.pushes().size(), 1u);
      ASSERT_TRUE(peer.store().Latest());
      EXPECT_EQ(peer.store().Latest()->version, 1u);
    }
    peer.Handle(RoundStarted(2, 1));
    if (beside) {
      const std::vector<PeerMessage> sent = peer.TakeAtLeast(1);
      ASSERT_THAT(Kinds(sent), ElementsAre(PeerMessage::kEvalReport));
      reports.push_back(sent[0]);
    }
    const std::vector<PeerSideAggregator::Push> pushes = aggregator.pushes();
    ASSERT_EQ(pushes.size(), 2u);
    EXPECT_EQ(pushes[1].meta.base_version(), 1u);
    EXPECT_FALSE(peer.store().Latest());
  }
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].eval_report().version(), 1u);
  EXPECT_EQ(reports[0].SerializeAsString(), reports[1].SerializeAsString());
}

// The evaluator holds no model while the worker trains and pushes: it keeps no reference of its
// own to the snapshot's copy, Pause() returns once it has let go of it, and once the copy is
// gone it evaluates the model read back from disk, with the same numbers. WaitUntilDone() lets
// a paused evaluation go on and returns the time waited. One model at a time (Submit waits for
// the one before); reports in order, each with its version.
TEST_F(FederatedSyncRunnerTest, TheEvaluatorLetsGoOfTheModelWhileTheWorkerTrains) {
  training::TrainerOptions options;
  options.spec = Spec();
  options.shard = training::ShardSpec{0, 2};
  auto trainer = training::Trainer::Create(options, *train_, *test_);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto model = (*trainer)->GetState(/*include_buffers=*/true);
  ASSERT_TRUE(model.ok());
  const absl::StatusOr<training::EvalStats> want = (*trainer)->Evaluate();
  ASSERT_TRUE(want.ok());
  auto file = tensor::SpillFile::Create("");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Write(model->values).ok());
  const ModelOnDisk on_disk{1, model->layout,
                            std::make_shared<tensor::SpillFile>(*std::move(file))};
  prometheus::Registry registry;
  PeerMetrics metrics(registry);
  absl::Mutex mu;
  std::vector<PeerMessage> reports;
  auto evaluator =
      BackgroundEvaluator::Create(**trainer, "fed", metrics, [&](const PeerMessage& m) {
        absl::MutexLock lock(&mu);
        reports.push_back(m);
      });
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();

  // Handed over while the worker trains; the snapshot goes before the evaluation can begin.
  (*evaluator)->Pause();
  auto copy = std::make_shared<const tensor::FlatModel>(*model);
  (*evaluator)->Submit(1, 1, copy, on_disk);
  EXPECT_EQ(copy.use_count(), 1);
  copy.reset();
  // Waiting for it lets it go on (the worker is not training while it waits), and says how long.
  EXPECT_GT((*evaluator)->WaitUntilDone(), absl::ZeroDuration());
  EXPECT_EQ((*evaluator)->WaitUntilDone(), absl::ZeroDuration());  // nothing under way
  // Version 2 waits for version 1's evaluation (from disk) to end; paused at once, whether part
  // way or before its first batch, the evaluator has let go of version 2's copy.
  copy = std::make_shared<const tensor::FlatModel>(*model);
  (*evaluator)->Submit(2, 2, copy, on_disk);
  (*evaluator)->Pause();
  EXPECT_EQ(copy.use_count(), 1);
  (*evaluator)->Resume();
  (*evaluator)->WaitUntilDone();

  absl::MutexLock lock(&mu);
  ASSERT_THAT(Kinds(reports), ElementsAre(PeerMessage::kEvalReport, PeerMessage::kEvalReport));
  for (size_t i = 0; i < reports.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(reports[i].eval_report().version(), i + 1);
    EXPECT_EQ(reports[i].eval_report().correct(), want->correct);
    EXPECT_EQ(reports[i].eval_report().total(), want->total);
    EXPECT_EQ(reports[i].eval_report().loss_sum(), want->loss_sum);
  }
}

class ByzantineTest : public FederatedSyncRunnerTest,
                      public ::testing::WithParamInterface<const char*> {};

TEST_P(ByzantineTest, PushedDeltaIsTheHonestDeltaTimesTheFactor) {
  absl::StatusOr<ByzantineFault> fault = ByzantineFault::Parse(GetParam());
  ASSERT_TRUE(fault.ok()) << fault.status();
  PeerSideAggregator honest_aggregator;
  PeerSideAggregator byzantine_aggregator;
  TestPeer honest(honest_aggregator, *train_, *test_);
  TestPeer byzantine(byzantine_aggregator, *train_, *test_, *fault);
  for (TestPeer* p : {&honest, &byzantine}) {
    p->Handle(Initialize());
    p->Handle(RoundStarted(1, 0));
    EXPECT_THAT(Kinds(p->Take()), ElementsAre(PeerMessage::kModelInitialized));
  }
  ASSERT_EQ(Accepted(honest_aggregator).size(), 1u);
  ASSERT_EQ(Accepted(byzantine_aggregator).size(), 1u);
  const tensor::FlatModel h = Accepted(honest_aggregator)[0];
  const tensor::FlatModel b = Accepted(byzantine_aggregator)[0];
  ASSERT_EQ(h.values.size(), b.values.size());
  double norm = 0;
  for (size_t i = 0; i < h.values.size(); ++i) {
    const double want = fault->factor() * h.values[i];
    ASSERT_NEAR(b.values[i], want, 1e-6 + 1e-5 * std::fabs(want)) << i;
    norm += static_cast<double>(h.values[i]) * h.values[i];
  }
  EXPECT_GT(norm, 0);  // it trained: the delta is not all zeros

  // What the Byzantine peer keeps is its own honest model.
  auto hp = honest.trainer().GetParameters();
  auto bp = byzantine.trainer().GetParameters();
  ASSERT_TRUE(hp.ok() && bp.ok());
  EXPECT_EQ(hp->Digest(), bp->Digest());
  // Until the round's model is published a federated-sync peer serves no snapshot: its memory
  // goes to training (the global model is at the aggregator).
  EXPECT_FALSE(byzantine.store().Latest());
}

INSTANTIATE_TEST_SUITE_P(Modes, ByzantineTest, ::testing::Values("scale:-10", "sign-flip"));

TEST(ByzantineFault, ParsesTheModesAndNamesTheFlagOnErrors) {
  absl::StatusOr<ByzantineFault> none = ByzantineFault::Parse("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->active());
  absl::StatusOr<ByzantineFault> scale = ByzantineFault::Parse("scale:-10");
  ASSERT_TRUE(scale.ok());
  EXPECT_TRUE(scale->active());
  EXPECT_EQ(scale->factor(), -10);
  absl::StatusOr<ByzantineFault> flip = ByzantineFault::Parse("sign-flip");
  ASSERT_TRUE(flip.ok());
  EXPECT_EQ(flip->factor(), -1);
  for (const char* bad : {"scale:", "scale:x", "scale:nan", "scale:inf", "flip", "scale-2"}) {
    absl::StatusOr<ByzantineFault> f = ByzantineFault::Parse(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << bad;
    EXPECT_TRUE(absl::StartsWith(f.status().message(), "--test-byzantine")) << f.status();
  }
  // base + factor · (model − base)
  tensor::FlatModel base;
  base.values = {1, 2, 3};
  tensor::FlatModel model;
  model.values = {2, 2, 1};
  ASSERT_TRUE(scale->CorruptModel(base, model).ok());
  EXPECT_THAT(model.values, ElementsAre(-9, 2, 23));
  std::vector<float> delta = {1, -2};
  flip->CorruptDelta(delta);
  EXPECT_THAT(delta, ElementsAre(-1, 2));
}

TEST(CompressionOf, MapsTheTaskSettingsToTheCompressor) {
  common::v1::TaskSpec spec;
  EXPECT_EQ(CompressionOf(spec).codec, common::v1::ENCODING_RAW);
  spec.set_compression(common::v1::COMPRESSION_TOPK);
  spec.set_topk_ratio(0.02);
  spec.set_topk_values(common::v1::COMPRESSION_INT8);
  spec.set_topk_min_elements(100);
  spec.set_topk_split(common::v1::TOPK_SPLIT_EQUAL);
  tensor::CompressionSettings c = CompressionOf(spec);
  EXPECT_EQ(c.codec, common::v1::ENCODING_SPARSE);
  EXPECT_EQ(c.topk_ratio, 0.02);
  EXPECT_EQ(c.topk_values, common::v1::ENCODING_INT8);
  EXPECT_EQ(c.topk_min_elements, 100u);
  EXPECT_EQ(c.topk_split, tensor::TopKSplit::kEqual);
  spec.set_topk_split(common::v1::TOPK_SPLIT_PER_TENSOR);
  EXPECT_EQ(CompressionOf(spec).topk_split, tensor::TopKSplit::kPerTensor);
  // A spec created over the API without a task file's defaults gets the same ones.
  common::v1::TaskSpec bare;
  bare.set_compression(common::v1::COMPRESSION_TOPK);
  c = CompressionOf(bare);
  EXPECT_EQ(c.topk_ratio, 0.01);
  EXPECT_EQ(c.topk_values, common::v1::ENCODING_RAW);
  EXPECT_EQ(c.topk_min_elements, 4096u);
  EXPECT_EQ(c.topk_split, tensor::TopKSplit::kPerTensor);
  bare.set_topk_min_elements(0);
  EXPECT_EQ(CompressionOf(bare).topk_min_elements, 0u);
}

}  // namespace
}  // namespace shoal::peer
