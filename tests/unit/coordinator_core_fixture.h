#pragma once

// Fakes, helpers and the fixture of the CoordinatorCore tests (coordinator_core_test.cc,
// coordinator_core_decentralized_test.cc, coordinator_failover_test.cc): the coordinator driven
// event by event with a fake clock, a scripted aggregator (tests/fakes) and fake peer streams;
// the aggregator work and store writes run on manual executors that Step() drains; the task
// store is the real SQLite store in a temp dir.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/dialer.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "tests/fakes/manual_executor.h"
#include "tests/fakes/scripted_aggregator.h"
#include "tests/testing/fake_clock.h"

namespace shoal::coordinator::core_testing {

using shoal::testing::FakeClock;

class FakeSink final : public PeerSink {
 public:
  void Send(const v1::CoordinatorEvent& event) override { events.push_back(event); }
  void Close(const absl::Status& status) override { closed = status; }
  // Kinds of the events received so far, then forgets them.
  std::vector<v1::CoordinatorEvent::KindCase> Take() {
    std::vector<v1::CoordinatorEvent::KindCase> kinds;
    for (const auto& e : events) kinds.push_back(e.kind_case());
    events.clear();
    return kinds;
  }
  std::vector<v1::CoordinatorEvent> events;
  std::optional<absl::Status> closed;
};

// Answers OK for the addresses in `reachable`; counts the dials.
class FakeDialer final : public Dialer {
 public:
  absl::Status Dial(const std::string& address, absl::Time) override {
    absl::MutexLock lock(&mu_);
    dialed_.push_back(address);
    if (reachable_.count(address) > 0) return absl::OkStatus();
    return absl::UnavailableError("connection refused");
  }
  std::vector<std::string> dialed() {
    absl::MutexLock lock(&mu_);
    return dialed_;
  }
  // The addresses that answer from now on; any other is refused.
  void SetReachable(std::set<std::string> addresses) {
    absl::MutexLock lock(&mu_);
    reachable_ = std::move(addresses);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> dialed_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> reachable_ ABSL_GUARDED_BY(mu_);
};

using FakeAggregator = fakes::ScriptedAggregator;

inline common::v1::TaskSpec Spec(const std::string& name, uint32_t min, uint32_t rounds) {
  common::v1::TaskSpec spec;
  spec.set_name(name);
  spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
  spec.set_model("mlp");
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.set_round_batches(10);
  spec.set_rounds(rounds);
  spec.set_min_participants(min);
  spec.set_round_deadline_seconds(30);
  spec.set_aggregation(common::v1::AGGREGATION_MEAN);
  spec.set_seed(1);
  return spec;
}

inline v1::Hello Hello(const std::string& name, uint32_t shard = 0, uint32_t count = 4) {
  v1::Hello hello;
  hello.set_name(name);
  hello.set_shard_index(shard);
  hello.set_shard_count(count);
  return hello;
}

inline v1::PeerMessage Eval(const std::string& task, uint64_t version, uint64_t correct,
                            uint64_t total) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_eval_report()->set_version(version);
  m.mutable_eval_report()->set_correct(correct);
  m.mutable_eval_report()->set_total(total);
  m.mutable_eval_report()->set_loss_sum(0.3 * total);
  return m;
}

// A repeated string field (peer ids, addresses) as a vector, for matchers.
inline std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return {ids.begin(), ids.end()};
}

inline v1::PeerMessage Initialized(const std::string& task) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_model_initialized();
  return m;
}

class CoordinatorCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterized test's name holds a '/' ("Name/0"): one directory, not a parent left over.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '-');
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-core-test-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::remove_all(dir_);
    store_ = *SqliteTaskStore::Open(dir_.string());
    Recreate();
  }
  void TearDown() override {
    RunWork();  // work queued for the core must run before it goes
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Recreate() {
    RunWork();
    core_.reset();
    metrics_ = std::make_unique<CoordinatorMetrics>(registry_);
    auto core = CoordinatorCore::Create(options_, *store_, aggregator_,
                                        CoordinatorExecutors{calls_, transfers_, store_writes_},
                                        clock_, *metrics_);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }

  // Runs the queued aggregator work and store writes (and what they queue in turn).
  void RunWork() {
    while (calls_.RunAll() + transfers_.RunAll() + store_writes_.RunAll() > 0) {
    }
  }
  // The driver's tick, then the work it and earlier inputs queued.
  void Step() {
    RunWork();
    core_->Step();
    RunWork();
  }
  // The aggregator accepted `peer`'s update for `round` (its watch stream says so); the work
  // that follows runs at the next Step().
  void Accept(const std::string& task, uint64_t round, const std::string& peer,
              int64_t train_ms = 0, uint64_t update_bytes = 0) {
    aggregator_.Accept(task, round, peer, train_ms, update_bytes);
  }

  std::shared_ptr<FakeSink> Join(const std::string& name) {
    auto sink = std::make_shared<FakeSink>();
    auto id = core_->Connect(Hello(name), /*identity=*/"", sink);
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, name);
    return sink;
  }

  v1::TaskStatus Status(const std::string& name) { return *core_->GetTaskStatus(name); }

  // Registers an aggregator, creates `spec`, joins `peers`, and lets the first peer store the
  // initial model: the task is then in round 1, training.
  std::map<std::string, std::shared_ptr<FakeSink>> StartTask(const common::v1::TaskSpec& spec,
                                                             std::vector<std::string> peers) {
    EXPECT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
    EXPECT_TRUE(core_->CreateTask(spec).ok());
    std::map<std::string, std::shared_ptr<FakeSink>> sinks;
    for (const auto& p : peers) sinks[p] = Join(p);
    Step();  // the aggregator learns the members, then no checkpoint is found
    EXPECT_EQ(Status(spec.name()).phase(), v1::ROUND_PHASE_INITIALIZING);
    EXPECT_TRUE(core_->OnMessage(peers.front(), Initialized(spec.name())).ok());
    Step();
    return sinks;
  }

  std::filesystem::path dir_;
  prometheus::Registry registry_;
  CoordinatorOptions options_;
  FakeClock clock_;
  FakeAggregator aggregator_;
  fakes::ManualExecutor calls_;
  fakes::ManualExecutor transfers_;
  fakes::ManualExecutor store_writes_;
  std::unique_ptr<TaskStore> store_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<CoordinatorCore> core_;
};

}  // namespace shoal::coordinator::core_testing
