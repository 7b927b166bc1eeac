// The peer's mode registry: every mode of the Mode enum that a task file accepts has exactly one
// runner, found by its mode; anything else is refused with a clear error.

#include <prometheus/registry.h>

#include <memory>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/task/task_mode.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/mode_registry.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"

namespace shoal::peer {
namespace {

using ::testing::HasSubstr;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

common::v1::TaskSpec Spec(common::v1::Mode mode) {
  common::v1::TaskSpec spec;
  spec.set_name("registry");
  spec.set_mode(mode);
  spec.set_model("mlp");
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.mutable_dataset()->set_train_limit(200);
  spec.mutable_dataset()->set_test_limit(50);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.set_round_batches(2);
  spec.set_rounds(1);
  spec.set_min_participants(1);
  spec.set_seed(3);
  return spec;
}

// Everything a runner may need, real where it is cheap; nothing is called here but the
// factories.
class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto train = training::LoadFashionMnist(kDataDir, training::Split::kTrain, 200);
    ASSERT_TRUE(train.ok()) << train.status();
    auto test = training::LoadFashionMnist(kDataDir, training::Split::kTest, 50);
    ASSERT_TRUE(test.ok()) << test.status();
    train_ = *std::move(train);
    test_ = *std::move(test);
  }

  // A trainer and deps for a task of `mode` (the trainer is kept until the test ends).
  ModeRunnerDeps Deps(common::v1::Mode mode) {
    training::TrainerOptions options;
    options.spec = Spec(common::v1::MODE_FEDERATED_SYNC);  // the trainer does not care
    options.shard = {0, 1};
    auto trainer = training::Trainer::Create(options, train_, test_);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    trainers_.push_back(*std::move(trainer));
    ModeRunnerDeps deps;
    *deps.assigned.mutable_spec() = Spec(mode);
    deps.assigned.set_aggregator_address("127.0.0.1:1");
    deps.trainer = trainers_.back().get();
    deps.snapshots = &store_;
    deps.peers = &peers_;
    deps.aggregator = &aggregator_;
    deps.metrics = &metrics_;
    deps.clock = &RealClock::Get();
    deps.wakeup = &wakeup_;
    deps.peer_id = "peer-a";
    deps.send = [](const coordinator::v1::PeerMessage&) {};
    return deps;
  }

  training::RawDataset train_;
  training::RawDataset test_;
  std::vector<std::unique_ptr<training::Trainer>> trainers_;
  prometheus::Registry registry_;
  PeerMetrics metrics_{registry_};
  SnapshotStore store_;
  GrpcPeerClient peers_{nullptr, &metrics_};
  aggregator::GrpcAggregatorClient aggregator_;
  rpc::Wakeup wakeup_{RealClock::Get()};
};

TEST_F(RegistryTest, EveryModeHasExactlyOneRunnerThatAcceptsOnlyItsOwnTasks) {
  const google::protobuf::EnumDescriptor* modes = common::v1::Mode_descriptor();
  std::set<common::v1::Mode> registered;
  for (const ModeEntry& entry : RegisteredModes()) {
    EXPECT_TRUE(registered.insert(entry.mode).second) << "registered twice: " << entry.mode;
    EXPECT_EQ(FindMode(entry.mode), &entry);
  }
  for (int i = 0; i < modes->value_count(); ++i) {
    const auto mode = static_cast<common::v1::Mode>(modes->value(i)->number());
    SCOPED_TRACE(modes->value(i)->name());
    if (mode == common::v1::MODE_UNSPECIFIED) {
      EXPECT_EQ(FindMode(mode), nullptr);
      continue;
    }
    // Every mode a task can have runs on the peer.
    const ModeEntry* entry = FindMode(mode);
    ASSERT_NE(entry, nullptr);
    absl::StatusOr<std::unique_ptr<ModeRunner>> runner = CreateModeRunner(Deps(mode));
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_NE(*runner, nullptr);
    // The entry's factory is that mode's: it refuses a task of any other mode.
    for (const ModeEntry& other : RegisteredModes()) {
      if (other.mode == mode) continue;
      absl::StatusOr<std::unique_ptr<ModeRunner>> wrong = entry->create(Deps(other.mode));
      EXPECT_TRUE(absl::IsInvalidArgument(wrong.status())) << other.mode;
      EXPECT_THAT(wrong.status().message(), HasSubstr(task::FindModeDefinition(mode)->name))
          << other.mode;
    }
  }
  EXPECT_EQ(registered.size(), static_cast<size_t>(modes->value_count() - 1));
}

TEST_F(RegistryTest, AModeWithoutARunnerIsRefusedByName) {
  for (int mode : {0, 99}) {
    absl::StatusOr<std::unique_ptr<ModeRunner>> runner =
        CreateModeRunner(Deps(static_cast<common::v1::Mode>(mode)));
    EXPECT_TRUE(absl::IsInvalidArgument(runner.status())) << mode;
    EXPECT_THAT(runner.status().message(), HasSubstr("cannot run mode")) << mode;
  }
  // A factory checks its dependencies instead of crashing later.
  ModeRunnerDeps missing = Deps(common::v1::MODE_FEDERATED_SYNC);
  missing.trainer = nullptr;
  EXPECT_TRUE(absl::IsInvalidArgument(CreateModeRunner(std::move(missing)).status()));
}

}  // namespace
}  // namespace shoal::peer
