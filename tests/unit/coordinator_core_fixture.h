#pragma once

// Fakes, helpers and the fixture of the CoordinatorCore tests (coordinator_core_test.cc,
// coordinator_core_decentralized_test.cc): the coordinator's state machine driven event by event
// with a fake clock, a fake aggregator and fake peer streams; the task store is the real SQLite
// store in a temp dir.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator::core_testing {

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

class FakeAggregator final : public aggregator::AggregatorClient {
 public:
  absl::Status OpenRound(const std::string& address,
                         const aggregator::v1::OpenRoundRequest& request, absl::Time) override {
    opened.push_back(request);
    return open_status;
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseRound(
      const std::string& address, const aggregator::v1::CloseRoundRequest& request,
      absl::Time) override {
    closed.push_back(request);
    if (!close_status.ok()) return close_status;
    aggregator::v1::CloseRoundResponse response;
    if (!contributors.empty()) ++version;
    response.set_version(version);
    for (const auto& c : contributors) response.add_contributors(c);
    response.set_num_samples(100 * contributors.size());
    response.set_mean_train_loss(0.5);
    return response;
  }
  absl::StatusOr<tensor::FlatModel> GetModel(const std::string&, const std::string&, uint64_t v,
                                             const aggregator::Caller&, absl::Time) override {
    tensor::FlatModel model;
    model.layout = *tensor::ModelLayout::Create({{"w", {2}}});
    model.values = {static_cast<float>(v), 1.0f};
    return model;
  }
  absl::StatusOr<uint64_t> PutModel(const std::string&, const common::v1::ModelMeta& meta,
                                    std::shared_ptr<const tensor::FlatModel> model,
                                    const aggregator::Caller&, absl::Time) override {
    puts.push_back({meta.task(), meta.version()});
    return model->Digest();
  }
  absl::StatusOr<bool> PushUpdate(const std::string&, const aggregator::v1::UpdateMeta&,
                                  std::shared_ptr<const tensor::FlatModel>, absl::Time) override {
    return absl::UnimplementedError("the coordinator never pushes");
  }
  absl::Status SetMembers(const std::string&, const aggregator::v1::SetMembersRequest& request,
                          absl::Time) override {
    members.push_back(request);
    return absl::OkStatus();
  }
  absl::Status ReleaseTask(const std::string&, const std::string& task, absl::Time) override {
    released.push_back(task);
    return absl::OkStatus();
  }

  absl::Status open_status;
  absl::Status close_status;
  std::vector<std::string> contributors;
  uint64_t version = 0;
  std::vector<aggregator::v1::OpenRoundRequest> opened;
  std::vector<aggregator::v1::CloseRoundRequest> closed;
  std::vector<std::pair<std::string, uint64_t>> puts;
  std::vector<std::string> released;
  std::vector<aggregator::v1::SetMembersRequest> members;
};

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

inline v1::PeerMessage Pushed(const std::string& task, uint64_t round) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_update_pushed()->set_round(round);
  m.mutable_update_pushed()->set_num_samples(100);
  m.mutable_update_pushed()->set_train_loss(0.5);
  return m;
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

inline v1::PeerMessage Initialized(const std::string& task) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_model_initialized();
  return m;
}

class CoordinatorCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-core-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    store_ = *TaskStore::Open(dir_.string());
    Recreate();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Recreate() {
    core_.reset();
    metrics_ = std::make_unique<CoordinatorMetrics>(registry_);
    auto core = CoordinatorCore::Create(options_, *store_, aggregator_, clock_, *metrics_);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
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
    core_->Step();  // the aggregator learns the members first
    EXPECT_EQ(Status(spec.name()).phase(), v1::ROUND_PHASE_INITIALIZING);
    EXPECT_TRUE(core_->OnMessage(peers.front(), Initialized(spec.name())).ok());
    core_->Step();
    return sinks;
  }

  std::filesystem::path dir_;
  prometheus::Registry registry_;
  CoordinatorOptions options_;
  FakeClock clock_;
  FakeAggregator aggregator_;
  std::unique_ptr<TaskStore> store_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<CoordinatorCore> core_;
};

}  // namespace shoal::coordinator::core_testing
