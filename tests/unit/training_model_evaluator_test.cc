// ModelEvaluator (Trainer::MakeEvaluator) with real LibTorch on real Fashion-MNIST data: the
// numbers Trainer::Evaluate gives for the same state, also while the trainer trains on another
// thread, and its errors.

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "libs/common/file_digest.h"
#include "libs/training/model_evaluator.h"
#include "libs/training/trainer.h"

namespace shoal::training {
namespace {

const char kDataDir[] = "/usr/share/datasets/fashion-mnist";

const RawDataset& TrainSet() {
  static const RawDataset* data = [] {
    auto d = LoadFashionMnist(kDataDir, Split::kTrain, 2000);
    EXPECT_TRUE(d.ok()) << d.status();
    return new RawDataset(d.ok() ? *std::move(d) : RawDataset{});
  }();
  return *data;
}
const RawDataset& TestSet() {
  static const RawDataset* data = [] {
    auto d = LoadFashionMnist(kDataDir, Split::kTest, 600);
    EXPECT_TRUE(d.ok()) << d.status();
    return new RawDataset(d.ok() ? *std::move(d) : RawDataset{});
  }();
  return *data;
}

TrainerOptions Options(const std::string& model) {
  TrainerOptions o;
  o.spec.set_name("t");
  o.spec.set_model(model);
  o.spec.set_batch_size(32);
  o.spec.set_seed(3);
  o.spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  o.spec.mutable_optimizer()->set_learning_rate(0.05);
  o.spec.mutable_optimizer()->set_momentum(0.9);
  o.spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  o.spec.mutable_dataset()->set_train_limit(2000);
  o.spec.mutable_dataset()->set_test_limit(600);
  o.shard = {0, 2};
  o.eval_batch_size = 64;  // several batches
  return o;
}

// A TorchScript CNN with batch normalisation (exported by the build): its state carries float
// buffers.
TrainerOptions BatchNormOptions() {
  TrainerOptions o = Options(kTorchScriptModel);
  const char* dir = std::getenv("SHOAL_TEST_MODELS");
  o.model_dir = dir != nullptr ? dir : "tests/models";
  o.spec.mutable_torchscript()->set_file("fashion_cnn.pt");
  absl::StatusOr<std::string> digest = Sha256File(o.model_dir + "/fashion_cnn.pt");
  EXPECT_TRUE(digest.ok()) << digest.status();
  o.spec.mutable_torchscript()->set_sha256(digest.ok() ? *digest : "");
  o.spec.set_loss(common::v1::LOSS_CROSS_ENTROPY);
  return o;
}

class ModelEvaluatorTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetTorchThreads(1).ok()); }
  TrainerOptions ParamOptions() const {
    return GetParam() == "cnn-bn" ? BatchNormOptions() : Options(GetParam());
  }
};

void ExpectSame(const EvalStats& a, const EvalStats& b) {
  EXPECT_EQ(a.correct, b.correct);
  EXPECT_EQ(a.total, b.total);
  EXPECT_EQ(a.loss_sum, b.loss_sum);  // bit for bit: the same batches through the same code
}

TEST_P(ModelEvaluatorTest, GivesTheTrainersNumbersWhileTheTrainerTrains) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(ParamOptions(), TrainSet(), TestSet());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  Trainer& t = **trainer;
  ASSERT_TRUE(t.TrainBatches(5, [] { return true; }).ok());
  absl::StatusOr<tensor::FlatModel> state = t.GetState(/*include_buffers=*/true);
  ASSERT_TRUE(state.ok()) << state.status();
  absl::StatusOr<EvalStats> want = t.Evaluate();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_GT(want->total, 64u);

  absl::StatusOr<std::unique_ptr<ModelEvaluator>> evaluator = t.MakeEvaluator();
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  absl::StatusOr<EvalStats> got = (*evaluator)->Evaluate(*state, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, *want);

  // On another thread while the trainer trains on: the same numbers, and training is not
  // disturbed (the evaluator's model is its own).
  absl::StatusOr<EvalStats> beside;
  std::thread evaluating([&] { beside = (*evaluator)->Evaluate(*state, nullptr); });
  absl::StatusOr<TrainStats> trained = t.TrainBatches(10, [] { return true; });
  evaluating.join();
  ASSERT_TRUE(trained.ok()) << trained.status();
  ASSERT_TRUE(beside.ok()) << beside.status();
  ExpectSame(*beside, *want);
  absl::StatusOr<EvalStats> after = t.Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->loss_sum, want->loss_sum);  // the trainer's own model moved on
}

// Stopped after two batches and resumed, on another copy of the state (as a background
// evaluation reads the model back from disk after a pause): the numbers of one pass, bit for bit.
TEST_P(ModelEvaluatorTest, AStoppedEvaluationGoesOnWhereItStopped) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(ParamOptions(), TrainSet(), TestSet());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->TrainBatches(5, [] { return true; }).ok());
  absl::StatusOr<tensor::FlatModel> state = (*trainer)->GetState(/*include_buffers=*/true);
  ASSERT_TRUE(state.ok()) << state.status();
  absl::StatusOr<EvalStats> want = (*trainer)->Evaluate();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_GT(want->total, 3u * 64);
  absl::StatusOr<std::unique_ptr<ModelEvaluator>> evaluator = (*trainer)->MakeEvaluator();
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();

  EvalStats so_far;
  int batches = 0;
  absl::StatusOr<EvalStats> stopped =
      (*evaluator)
          ->Evaluate(
              *state, [&batches] { return ++batches <= 2; }, &so_far);
  EXPECT_TRUE(absl::IsCancelled(stopped.status())) << stopped.status();
  EXPECT_EQ(so_far.total, 2u * 64);
  const tensor::FlatModel other_copy = *state;
  state->values.assign(state->values.size(), 0);  // the first copy is gone
  batches = 0;
  absl::StatusOr<EvalStats> resumed =
      (*evaluator)
          ->Evaluate(
              other_copy, [&batches] { return ++batches > 0; }, &so_far);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(batches, static_cast<int>((want->total - 2 * 64 + 63) / 64));  // only the rest
  ExpectSame(*resumed, *want);
  ExpectSame(so_far, *want);
}

INSTANTIATE_TEST_SUITE_P(Models, ModelEvaluatorTest, ::testing::Values("mlp", "cnn", "cnn-bn"));

TEST(ModelEvaluator, RefusesAnotherLayoutAndStopsWhenAsked) {
  ASSERT_TRUE(SetTorchThreads(1).ok());
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(BatchNormOptions(), TrainSet(), TestSet());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<std::unique_ptr<ModelEvaluator>> evaluator = (*trainer)->MakeEvaluator();
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  absl::StatusOr<tensor::FlatModel> state = (*trainer)->GetState(/*include_buffers=*/true);
  ASSERT_TRUE(state.ok());

  tensor::FlatModel other;
  auto layout = tensor::ModelLayout::Create({{"w", {3}}});
  ASSERT_TRUE(layout.ok());
  other.layout = *layout;
  other.values = {1, 2, 3};
  EXPECT_TRUE(absl::IsInvalidArgument((*evaluator)->Evaluate(other, nullptr).status()));

  int batches = 0;
  absl::StatusOr<EvalStats> stopped =
      (*evaluator)->Evaluate(*state, [&batches] { return ++batches < 3; });
  EXPECT_TRUE(absl::IsCancelled(stopped.status())) << stopped.status();
  EXPECT_EQ(batches, 3);

  // Parameters only (the buffers stay the model's own, here the fresh model's, as in the
  // trainer), and after a stopped evaluation: the trainer's numbers still.
  absl::StatusOr<tensor::FlatModel> params = (*trainer)->GetState(/*include_buffers=*/false);
  ASSERT_TRUE(params.ok());
  absl::StatusOr<EvalStats> want = (*trainer)->Evaluate();
  absl::StatusOr<EvalStats> got = (*evaluator)->Evaluate(*params, nullptr);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  ExpectSame(*got, *want);
}

}  // namespace
}  // namespace shoal::training
