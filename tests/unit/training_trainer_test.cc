// Models and the trainer on real Fashion-MNIST data with real LibTorch.

#include <dlfcn.h>

#include <cmath>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/training/models.h"
#include "libs/training/trainer.h"
#include "tests/testing/joining_thread.h"

namespace shoal::training {
namespace {

using ::testing::HasSubstr;

const char kDataDir[] = "/usr/share/datasets/fashion-mnist";

struct Data {
  RawDataset train;
  RawDataset test;
};

const Data& SharedData() {
  static const Data* data = [] {
    auto train = LoadFashionMnist(kDataDir, Split::kTrain);
    auto test = LoadFashionMnist(kDataDir, Split::kTest);
    EXPECT_TRUE(train.ok() && test.ok());
    return new Data{train.ok() ? *std::move(train) : RawDataset{},
                    test.ok() ? *std::move(test) : RawDataset{}};
  }();
  return *data;
}

TrainerOptions Options(const std::string& model, uint32_t train_limit = 4000,
                       uint32_t test_limit = 1000) {
  TrainerOptions o;
  o.spec.set_name("t");
  o.spec.set_model(model);
  o.spec.set_batch_size(32);
  o.spec.set_seed(11);
  o.spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  o.spec.mutable_optimizer()->set_learning_rate(0.05);
  o.spec.mutable_optimizer()->set_momentum(0.9);
  o.spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  o.spec.mutable_dataset()->set_train_limit(train_limit);
  o.spec.mutable_dataset()->set_test_limit(test_limit);
  o.shard = {0, 2};
  return o;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainerOptions& o) {
  auto t = Trainer::Create(o, SharedData().train, SharedData().test);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

class TrainingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetTorchThreads(1).ok()); }
};

TEST_F(TrainingTest, UnknownModelIsInvalidArgumentListingKnownOnes) {
  auto m = MakeModel("resnet", 1);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("resnet"));
  EXPECT_THAT(m.status().message(), HasSubstr("cnn"));
  EXPECT_THAT(m.status().message(), HasSubstr("mlp"));
  auto t = Trainer::Create(Options("resnet"), SharedData().train, SharedData().test);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("unknown model"));
}

TEST_F(TrainingTest, BadOptionsAndDevices) {
  TrainerOptions o = Options("mlp");
  o.spec.set_batch_size(0);
  EXPECT_THAT(o.Validate().message(), HasSubstr("batch_size"));
  o = Options("mlp");
  o.spec.mutable_optimizer()->set_learning_rate(0);
  EXPECT_THAT(o.Validate().message(), HasSubstr("learning_rate"));
  o = Options("mlp");
  o.shard = {2, 2};
  EXPECT_THAT(o.Validate().message(), HasSubstr("shard"));
  o = Options("mlp");
  o.device = "tpu";
  EXPECT_THAT(o.Validate().message(), HasSubstr("device"));
  EXPECT_EQ(CheckDevice("tpu").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckDevice("cpu").ok());
  absl::Status cuda = CheckDevice("cuda");
  EXPECT_TRUE(cuda.ok() || cuda.code() == absl::StatusCode::kFailedPrecondition) << cuda;
  o = Options("mlp");
  o.data_dir = "/nonexistent";
  EXPECT_EQ(Trainer::Create(o).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TrainingTest, SameSeedGivesIdenticalParametersAndLayout) {
  for (const char* model : {"mlp", "cnn"}) {
    auto a = MakeTrainer(Options(model));
    TrainerOptions other = Options(model);
    other.shard = {1, 2};  // the shard does not change the initial weights
    auto b = MakeTrainer(other);
    ASSERT_TRUE(a && b);
    auto pa = a->GetParameters();
    auto pb = b->GetParameters();
    ASSERT_TRUE(pa.ok() && pb.ok());
    EXPECT_TRUE(pa->layout == pb->layout);
    EXPECT_EQ(pa->values, pb->values) << model;
    EXPECT_EQ(pa->Digest(), pb->Digest());
    auto init = a->InitialParameters();
    ASSERT_TRUE(init.ok());
    EXPECT_EQ(init->values, pa->values);
    // Trained, the trainer still knows the fresh model's parameters.
    ASSERT_TRUE(a->TrainBatches(2, nullptr).ok());
    EXPECT_NE(a->GetParameters()->values, pa->values);
    EXPECT_EQ(a->InitialParameters()->values, pa->values);

    TrainerOptions seeded = Options(model);
    seeded.spec.set_seed(12);
    auto c = MakeTrainer(seeded);
    ASSERT_TRUE(c);
    EXPECT_NE(c->GetParameters()->values, pa->values);
  }
  auto cnn = MakeTrainer(Options("cnn"));
  ASSERT_TRUE(cnn);
  EXPECT_EQ(cnn->layout().DebugString(),
            "conv1.weight[16,1,5,5], conv1.bias[16], conv2.weight[32,16,5,5], conv2.bias[32], "
            "fc1.weight[128,1568], fc1.bias[128], fc2.weight[10,128], fc2.bias[10]");
}

TEST_F(TrainingTest, SetParametersRoundTripsAndChecksTheLayout) {
  auto t = MakeTrainer(Options("cnn"));
  ASSERT_TRUE(t);
  auto p = t->GetParameters();
  ASSERT_TRUE(p.ok());
  tensor::FlatModel changed = *p;
  for (size_t i = 0; i < changed.values.size(); ++i) changed.values[i] = 0.001f * (i % 97);
  ASSERT_TRUE(t->SetParameters(changed).ok());
  EXPECT_EQ(t->GetParameters()->values, changed.values);

  auto mlp = MakeTrainer(Options("mlp"));
  ASSERT_TRUE(mlp);
  absl::Status s = t->SetParameters(*mlp->GetParameters());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layout"));
}

// Read into a recycled buffer, the parameters take its storage whatever it held, and a buffer of
// another size is fitted.
TEST_F(TrainingTest, ParametersAreReadIntoTheStorageOfAGivenBuffer) {
  auto t = MakeTrainer(Options("cnn"));
  ASSERT_TRUE(t);
  auto want = t->GetParameters();
  ASSERT_TRUE(want.ok());
  std::vector<float> buffer(want->values.size(), -1.0f);
  const float* storage = buffer.data();
  auto got = t->GetParameters(std::move(buffer));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->values.data(), storage);
  EXPECT_EQ(got->values, want->values);
  EXPECT_TRUE(got->layout == want->layout);
  for (size_t size : {size_t{10}, want->values.size() + 100}) {
    got = t->GetParameters(std::vector<float>(size, 7.0f));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->values, want->values) << size;
  }
}

TEST_F(TrainingTest, TrainingReducesLossAndBeatsChance) {
  auto t = MakeTrainer(Options("mlp"));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->train_size(), 2000u);  // 4000 / 2 shards
  EXPECT_EQ(t->test_size(), 500u);    // 1000 / 2 shards
  auto before = t->Evaluate();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->total, 500u);

  auto first = t->TrainBatches(20, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->samples, 20u * 32u);
  EXPECT_EQ(first->batches, 20u);
  TrainStats last;
  for (int i = 0; i < 10; ++i) {  // 300 batches, several epochs of the 2000-sample shard
    auto s = t->TrainBatches(30, [] { return true; });
    ASSERT_TRUE(s.ok()) << s.status();
    last = *s;
  }
  EXPECT_LT(last.mean_loss, 0.6 * first->mean_loss);
  auto after = t->Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_GT(after->accuracy(), 0.7);  // chance is 0.1
  EXPECT_LT(after->loss_sum, before->loss_sum);
}

TEST_F(TrainingTest, CnnTrainsToo) {
  auto t = MakeTrainer(Options("cnn"));
  ASSERT_TRUE(t);
  auto s = t->TrainBatches(60, nullptr);
  ASSERT_TRUE(s.ok()) << s.status();
  auto e = t->Evaluate();
  ASSERT_TRUE(e.ok());
  EXPECT_GT(e->accuracy(), 0.5);
}

TEST_F(TrainingTest, WideMlpHasItsDocumentedSizeAndTrains) {
  // Default width 5000: 784*5000 + 5000 + 5000*5000 + 5000 + 5000*10 + 10 parameters.
  auto wide = MakeTrainer(Options("wide-mlp"));
  ASSERT_TRUE(wide);
  auto params = wide->GetParameters();
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->values.size(), 28'980'010u);
  auto s = wide->TrainBatches(2, nullptr);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(std::isfinite(s->mean_loss));

  TrainerOptions narrow = Options("wide-mlp");
  narrow.spec.set_model_width(256);
  auto t = MakeTrainer(narrow);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->GetParameters()->values.size(), 784u * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
  ASSERT_TRUE(t->TrainBatches(60, nullptr).ok());
  auto e = t->Evaluate();
  ASSERT_TRUE(e.ok());
  EXPECT_GT(e->accuracy(), 0.5);

  auto bad = MakeModel("wide-mlp", 1, 8);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "model_width must be in 16..16384, got 8");
}

TEST_F(TrainingTest, SteppingInsideBackwardGivesTheSameParametersAsAfterIt) {
  for (const auto kind : {common::v1::OPTIMIZER_SGD, common::v1::OPTIMIZER_ADAM}) {
    for (const char* model : {"mlp", "cnn"}) {
      TrainerOptions o = Options(model);
      o.spec.mutable_optimizer()->set_kind(kind);
      if (kind == common::v1::OPTIMIZER_ADAM) o.spec.mutable_optimizer()->set_learning_rate(0.001);
      TrainerOptions after = o;
      after.step_in_backward = false;
      auto in = MakeTrainer(o);
      auto out = MakeTrainer(after);
      ASSERT_TRUE(in && out);
      auto a = in->TrainBatches(6, nullptr);
      auto b = out->TrainBatches(6, nullptr);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->mean_loss, b->mean_loss) << model;
      auto pa = in->GetParameters();
      auto pb = out->GetParameters();
      ASSERT_TRUE(pa.ok() && pb.ok());
      EXPECT_EQ(pa->values, pb->values) << model << " optimizer " << kind;
      EXPECT_NE(pa->values, MakeTrainer(o)->GetParameters()->values);  // it did train
    }
  }
}

TEST_F(TrainingTest, KeepGoingFalseAbandonsBetweenBatches) {
  auto t = MakeTrainer(Options("mlp"));
  ASSERT_TRUE(t);
  int asked = 0;
  auto s = t->TrainBatches(100, [&] { return ++asked <= 3; });
  EXPECT_EQ(s.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 4);
}

TEST_F(TrainingTest, SameSeedTrainsIdentically) {
  auto a = MakeTrainer(Options("mlp"));
  auto b = MakeTrainer(Options("mlp"));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->TrainBatches(25, nullptr).ok());
  ASSERT_TRUE(b->TrainBatches(25, nullptr).ok());
  EXPECT_EQ(a->GetParameters()->values, b->GetParameters()->values);
}

// A round thrown away and trained again trains the same batches the same way: the parameters,
// the optimizer's momentum and the data position all go back.
TEST_F(TrainingTest, RestoredProgressTrainsTheSameBatchesAgain) {
  auto t = MakeTrainer(Options("mlp"));
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->TrainBatches(3, nullptr).ok());  // momentum is non-zero from here on
  auto params = t->GetParameters();
  auto progress = t->SaveProgress();
  ASSERT_TRUE(params.ok() && progress.ok());
  ASSERT_TRUE(t->TrainBatches(4, nullptr).ok());
  const std::vector<float> first = t->GetParameters()->values;
  ASSERT_TRUE(t->SetParameters(*params).ok());
  ASSERT_TRUE(t->RestoreProgress(*progress).ok());
  ASSERT_TRUE(t->TrainBatches(4, nullptr).ok());
  EXPECT_EQ(t->GetParameters()->values, first);
  // Without restoring the progress the next batches (and the momentum) differ.
  ASSERT_TRUE(t->SetParameters(*params).ok());
  ASSERT_TRUE(t->TrainBatches(4, nullptr).ok());
  EXPECT_NE(t->GetParameters()->values, first);
}

// Models trained at once on threads of one process (a peer evaluating while it trains, tasks
// side by side, the in-memory clusters of the tests) train exactly as each would alone. With a
// BLAS that is not safe for concurrent callers (OpenBLAS's serial build) the products of one
// thread now and then come out wrong under load (2 of 10 of these runs beside stress-ng). And
// OpenBLAS, when loaded, runs each call on its caller's thread.
TEST_F(TrainingTest, ModelsTrainedAtOnceTrainAsEachAlone) {
  auto alone = MakeTrainer(Options("mlp"));
  ASSERT_TRUE(alone);
  using GetThreads = int (*)();
  if (auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) {
    EXPECT_EQ(get(), 1) << "OpenBLAS runs its own threads beside the callers'";
  }
  ASSERT_TRUE(alone->TrainBatches(20, nullptr).ok());
  const std::vector<float> want = alone->GetParameters()->values;
  for (int rep = 0; rep < 10; ++rep) {
    std::vector<std::unique_ptr<Trainer>> trainers;
    for (int i = 0; i < 3; ++i) {
      trainers.push_back(MakeTrainer(Options("mlp")));
      ASSERT_TRUE(trainers.back());
    }
    {
      std::vector<std::unique_ptr<shoal::testing::JoiningThread>> threads;
      for (auto& t : trainers) {
        threads.push_back(std::make_unique<shoal::testing::JoiningThread>(
            [&t] { EXPECT_TRUE(t->TrainBatches(20, nullptr).ok()); }));
      }
    }
    for (size_t i = 0; i < trainers.size(); ++i) {
      EXPECT_EQ(trainers[i]->GetParameters()->values, want)
          << "repetition " << rep << ", model " << i;
    }
  }
}

}  // namespace
}  // namespace shoal::training
