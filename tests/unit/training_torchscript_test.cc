// TorchScript models (exported by PyTorch with deploy/models/export.py into $SHOAL_TEST_MODELS)
// trained by the trainer on real Fashion-MNIST data, the task's choice of loss, the refusals of
// a model that does not fit, and the export of a trained model back to TorchScript.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/common/file_digest.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/spill_file.h"
#include "libs/training/models.h"
#include "libs/training/trainer.h"

namespace shoal::training {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const char kDataDir[] = "/usr/share/datasets/fashion-mnist";

std::string ModelsDir() {
  const char* dir = std::getenv("SHOAL_TEST_MODELS");
  return dir != nullptr ? dir : "tests/models";
}

struct Data {
  RawDataset train;
  RawDataset test;
};

const Data& SharedData() {
  static const Data* data = [] {
    auto train = LoadFashionMnist(kDataDir, Split::kTrain, 4000);
    auto test = LoadFashionMnist(kDataDir, Split::kTest, 1000);
    EXPECT_TRUE(train.ok() && test.ok());
    return new Data{train.ok() ? *std::move(train) : RawDataset{},
                    test.ok() ? *std::move(test) : RawDataset{}};
  }();
  return *data;
}

// A task whose model is the exported file `name` (relative, found through model_dir).
TrainerOptions ScriptOptions(const std::string& name) {
  TrainerOptions o;
  o.spec.set_name("t");
  o.spec.set_model(kTorchScriptModel);
  o.spec.mutable_torchscript()->set_file(name);
  absl::StatusOr<std::string> digest = Sha256File(ModelsDir() + "/" + name);
  EXPECT_TRUE(digest.ok()) << digest.status() << " (run the build: it exports the models)";
  o.spec.mutable_torchscript()->set_sha256(digest.ok() ? *digest : "");
  o.spec.set_loss(common::v1::LOSS_CROSS_ENTROPY);
  o.spec.set_batch_size(32);
  o.spec.set_seed(11);
  o.spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  o.spec.mutable_optimizer()->set_learning_rate(0.05);
  o.spec.mutable_optimizer()->set_momentum(0.9);
  o.spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  o.model_dir = ModelsDir();
  o.shard = {0, 1};
  return o;
}

absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& o) {
  return Trainer::Create(o, SharedData().train, SharedData().test);
}

class TorchScriptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetTorchThreads(1).ok()); }
  void SetUp() override {
    tmp_ = std::filesystem::temp_directory_path() /
           ("shoal-ts-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(tmp_);
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }
  std::filesystem::path tmp_;
};

TEST_F(TorchScriptTest, MlpTrainsAndItsParametersKeepTheModulesOrderAndNames) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = Create(ScriptOptions("fashion_mlp.pt"));
  ASSERT_TRUE(t.ok()) << t.status();
  const tensor::ModelLayout& layout = (*t)->layout();
  ASSERT_EQ(layout.num_tensors(), 4u);
  EXPECT_EQ(layout.tensors()[0].name, "fc1.weight");
  EXPECT_EQ(layout.tensors()[3].name, "fc2.bias");
  EXPECT_EQ(layout.total_elements(), 784u * 128 + 128 + 128 * 10 + 10);
  // The file's weights are the initial model, on every peer alike.
  absl::StatusOr<tensor::FlatModel> before = (*t)->GetParameters();
  absl::StatusOr<tensor::FlatModel> initial = (*t)->InitialParameters();
  ASSERT_TRUE(before.ok() && initial.ok());
  EXPECT_EQ(before->values, initial->values);
  absl::StatusOr<EvalStats> chance = (*t)->Evaluate();
  ASSERT_TRUE(chance.ok());
  ASSERT_TRUE((*t)->TrainBatches(120, nullptr).ok());
  absl::StatusOr<EvalStats> trained = (*t)->Evaluate();
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_GT(trained->accuracy(), 0.65) << "chance was " << chance->accuracy();
  EXPECT_LT(trained->loss_sum, chance->loss_sum);
}

TEST_F(TorchScriptTest, CnnWithBatchNormTrainsAndExposesItsBuffersAsState) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = Create(ScriptOptions("fashion_cnn.pt"));
  ASSERT_TRUE(t.ok()) << t.status();
  // Parameters only in the exchanged model; with buffers, the running statistics follow.
  const tensor::ModelLayout& state = (*t)->state_layout(/*include_buffers=*/true);
  EXPECT_GT(state.num_tensors(), (*t)->layout().num_tensors());
  EXPECT_EQ(state.tensors()[(*t)->layout().num_tensors()].name, "buffer:bn1.running_mean");
  ASSERT_TRUE((*t)->TrainBatches(80, nullptr).ok());
  absl::StatusOr<EvalStats> e = (*t)->Evaluate();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GT(e->accuracy(), 0.6);
}

TEST_F(TorchScriptTest, MseAndBceLossesTrainTheSameModel) {
  for (common::v1::Loss loss : {common::v1::LOSS_MSE, common::v1::LOSS_BCE}) {
    TrainerOptions o = ScriptOptions("fashion_mlp.pt");
    o.spec.set_loss(loss);
    o.spec.mutable_optimizer()->set_learning_rate(0.02);
    absl::StatusOr<std::unique_ptr<Trainer>> t = Create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<TrainStats> first = (*t)->TrainBatches(10, nullptr);
    absl::StatusOr<TrainStats> later = (*t)->TrainBatches(100, nullptr);
    ASSERT_TRUE(first.ok() && later.ok());
    EXPECT_LT(later->mean_loss, first->mean_loss) << "loss " << loss;
    absl::StatusOr<EvalStats> e = (*t)->Evaluate();
    ASSERT_TRUE(e.ok());
    EXPECT_GT(e->accuracy(), 0.5) << "loss " << loss;
  }
}

TEST_F(TorchScriptTest, AnotherCopyOfTheFileIsRefusedNamingBothDigests) {
  std::filesystem::copy_file(ModelsDir() + "/fashion_cnn.pt", tmp_ / "fashion_mlp.pt");
  TrainerOptions o = ScriptOptions("fashion_mlp.pt");
  o.model_dir = tmp_.string();
  absl::StatusOr<std::unique_ptr<Trainer>> t = Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::string> theirs = Sha256File((tmp_ / "fashion_mlp.pt").string());
  ASSERT_TRUE(theirs.ok());
  EXPECT_THAT(t.status().message(),
              AllOf(HasSubstr(*theirs), HasSubstr(o.spec.torchscript().sha256()),
                    HasSubstr("fashion_mlp.pt")));
}

TEST_F(TorchScriptTest, MissingFileNotTorchScriptAndWrongOutputAreRefusedClearly) {
  TrainerOptions missing = ScriptOptions("fashion_mlp.pt");
  missing.model_dir = tmp_.string();
  EXPECT_EQ(Create(missing).status().code(), absl::StatusCode::kNotFound);

  std::ofstream(tmp_ / "junk.pt") << "this is not a TorchScript archive";
  TrainerOptions junk = ScriptOptions("fashion_mlp.pt");
  junk.model_dir = tmp_.string();
  junk.spec.mutable_torchscript()->set_file("junk.pt");
  junk.spec.mutable_torchscript()->set_sha256(*Sha256File((tmp_ / "junk.pt").string()));
  absl::StatusOr<std::unique_ptr<Trainer>> t = Create(junk);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), AllOf(HasSubstr("junk.pt"), HasSubstr("not a TorchScript")));

  t = Create(ScriptOptions("wrong_output.pt"));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(),
              AllOf(HasSubstr("[1, 7]"), HasSubstr("10 classes"), HasSubstr("needs [1, 10]")));
}

TEST_F(TorchScriptTest, TrainedWeightsWriteBackAsATorchScriptFile) {
  TrainerOptions o = ScriptOptions("fashion_mlp.pt");
  absl::StatusOr<std::unique_ptr<Trainer>> t = Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->TrainBatches(20, nullptr).ok());
  absl::StatusOr<tensor::FlatModel> trained = (*t)->GetParameters();
  ASSERT_TRUE(trained.ok());
  const std::string out = (tmp_ / "trained.pt").string();
  ASSERT_TRUE(WriteTorchScript(o.spec, o.model_dir, *trained, out).ok());

  // The written file is a TorchScript model holding exactly the trained parameters.
  absl::StatusOr<std::unique_ptr<Model>> reloaded = LoadModel(o.spec, out);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  size_t offset = 0;
  for (const auto& [name, p] : (*reloaded)->NamedParameters()) {
    torch::Tensor flat = p.detach().contiguous().view({-1});
    ASSERT_EQ(std::memcmp(flat.data_ptr<float>(), trained->values.data() + offset,
                          static_cast<size_t>(flat.numel()) * sizeof(float)),
              0)
        << name;
    offset += static_cast<size_t>(flat.numel());
  }
  EXPECT_EQ(offset, trained->values.size());

  // A built-in model has no TorchScript form; a model of another layout does not fit the file.
  TrainerOptions builtin = o;
  builtin.spec.set_model("mlp");
  EXPECT_EQ(WriteTorchScript(builtin.spec, "", *trained, out).code(),
            absl::StatusCode::kFailedPrecondition);
  tensor::FlatModel other = *trained;
  other.values.pop_back();
  EXPECT_EQ(WriteTorchScript(o.spec, o.model_dir, other, out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TorchScriptTest, BatchNormStatisticsTravelWithTheStateIntoTheWrittenFile) {
  // What the federated modes upload first: a fresh model's parameters and float buffers.
  TrainerOptions o = ScriptOptions("fashion_cnn.pt");
  absl::StatusOr<std::unique_ptr<Trainer>> t = Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<tensor::FlatModel> initial = (*t)->InitialState(/*include_buffers=*/true);
  ASSERT_TRUE(initial.ok()) << initial.status();
  const tensor::ModelLayout& state = (*t)->state_layout(/*include_buffers=*/true);
  ASSERT_EQ(initial->layout, state);
  const size_t running_var = [&] {
    for (size_t i = 0; i < state.num_tensors(); ++i) {
      if (state.tensors()[i].name == "buffer:bn1.running_var") return i;
    }
    return state.num_tensors();
  }();
  ASSERT_LT(running_var, state.num_tensors());
  EXPECT_EQ(initial->values[state.offset(running_var)], 1.0f);  // a fresh BatchNorm's variance

  // Trained, the statistics move; written with the state, the file evaluates like the trainer.
  ASSERT_TRUE((*t)->TrainBatches(40, nullptr).ok());
  absl::StatusOr<tensor::FlatModel> trained = (*t)->GetState(/*include_buffers=*/true);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_NE(trained->values[state.offset(running_var)], 1.0f);
  absl::StatusOr<EvalStats> before = (*t)->Evaluate();
  ASSERT_TRUE(before.ok());
  const std::string out = (tmp_ / "trained_bn.pt").string();
  ASSERT_TRUE(WriteTorchScript(o.spec, o.model_dir, *trained, out).ok());
  TrainerOptions reloaded = o;
  reloaded.model_dir = tmp_.string();
  reloaded.spec.mutable_torchscript()->set_file("trained_bn.pt");
  absl::StatusOr<std::string> digest = Sha256File(out);
  ASSERT_TRUE(digest.ok());
  reloaded.spec.mutable_torchscript()->set_sha256(*digest);
  absl::StatusOr<std::unique_ptr<Trainer>> r = Create(reloaded);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<tensor::FlatModel> read_back = (*r)->GetState(/*include_buffers=*/true);
  ASSERT_TRUE(read_back.ok());
  EXPECT_EQ(read_back->values, trained->values);
  absl::StatusOr<EvalStats> after = (*r)->Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->correct, before->correct);

  // SetState takes the state back into another trainer: same evaluation.
  absl::StatusOr<std::unique_ptr<Trainer>> fresh = Create(o);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->SetState(*trained).ok());
  absl::StatusOr<EvalStats> set = (*fresh)->Evaluate();
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->correct, before->correct);

  // So does SetStateFrom, reading from a file on disk (a peer's download): the same state.
  absl::StatusOr<tensor::SpillFile> file = tensor::SpillFile::Create(tmp_.string());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Write(trained->values).ok());
  absl::StatusOr<std::unique_ptr<Trainer>> from_file = Create(o);
  ASSERT_TRUE(from_file.ok());
  ASSERT_TRUE(
      (*from_file)
          ->SetStateFrom(
              state, [&](size_t first, absl::Span<float> out) { return file->ReadAt(first, out); })
          .ok());
  EXPECT_EQ((*from_file)->GetState(/*include_buffers=*/true)->values, trained->values);
  // A read that fails is the call's error; a layout of another model is refused unread.
  absl::Status failed = (*from_file)->SetStateFrom(state, [](size_t, absl::Span<float>) {
    return absl::DataLossError("disk gone");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  absl::StatusOr<tensor::ModelLayout> other = tensor::ModelLayout::Create({{"w", {3}}});
  ASSERT_TRUE(other.ok());
  absl::Status refused = (*from_file)->SetStateFrom(*other, [](size_t, absl::Span<float>) {
    return absl::InternalError("never read");
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("does not match"));
}

// A trainer that loads a CSV table itself (no coordinator) takes the federation's statistics
// (normalization standardize without mean/std) only when it holds all of the task's data
// (shoal-train's centralized baseline); then they are its own training data's.
TEST_F(TorchScriptTest, ACsvTaskOfFederationStatisticsNeedsAllTheDataInOneTrainer) {
  {
    std::ofstream csv(tmp_ / "train.csv");
    csv << "a,b,c,d,e,f,g,h,label\n";
    for (int i = 0; i < 24; ++i) {
      for (int f = 0; f < 8; ++f) csv << (i * (f + 3)) % 11 + 500 * f << ",";
      csv << i % 4 << "\n";
    }
  }
  TrainerOptions o = ScriptOptions("tabular_mlp.pt");
  o.data_dir = tmp_.string();
  common::v1::DatasetSpec& d = *o.spec.mutable_dataset();
  d.set_format(common::v1::DATA_FORMAT_CSV);
  d.set_train("train.csv");
  d.set_test_fraction(0.25);
  d.set_label_column("label");
  d.set_num_classes(4);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  absl::StatusOr<std::unique_ptr<Trainer>> refused = Trainer::Create(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("only the coordinator adds up"), HasSubstr("standardize-local")));
  o.holds_all_data = true;
  absl::StatusOr<std::unique_ptr<Trainer>> all = Trainer::Create(o);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->train_size(), 18u);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE_LOCAL);
  o.holds_all_data = false;
  EXPECT_TRUE(Trainer::Create(o).ok());
}

}  // namespace
}  // namespace shoal::training
