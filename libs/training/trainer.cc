#include "libs/training/trainer.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/data/feature_moments.h"
#include "libs/data/task_data.h"
#include "libs/task/task_model.h"
#include "libs/task/task_privacy.h"
#include "libs/training/blas_threads.h"
#include "libs/training/dp_batches.h"
#include "libs/training/loss.h"
#include "libs/training/model_evaluation.h"
#include "libs/training/model_evaluator.h"
#include "libs/training/model_state.h"
#include "libs/training/models.h"
#include "libs/training/shard_tensors.h"

namespace shoal::training {
namespace {

// Drops the gradients rather than zeroing them: the next backward pass then stores its gradients
// as they come instead of adding them to zeros through a temporary (a model's worth of memory
// at the peak), and between rounds they take no memory at all.
void ReleaseGradients(Model& model) {
  for (auto& [name, value] : model.NamedParameters()) value.mutable_grad() = torch::Tensor();
}

// Steps the optimizer for one parameter as soon as its gradient is complete, inside backward(),
// and frees that gradient at once. The step is the optimizer's own (it skips parameters without
// a gradient), so the result is what step() after backward() gives; but only one parameter's
// gradient exists at a time, not all of them: SGD with momentum then holds the parameters, the
// momentum and the largest gradient, under 3x the model, instead of 3x plus the activations.
// Safe because every node that uses the parameter's value has run before its accumulator.
class StepInBackward final : public torch::autograd::FunctionPostHook {
 public:
  StepInBackward(const std::unique_ptr<torch::optim::Optimizer>& optimizer, torch::Tensor param)
      : optimizer_(optimizer), param_(std::move(param)) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    optimizer_->step();
    param_.mutable_grad() = torch::Tensor();
    return outputs;
  }

 private:
  const std::unique_ptr<torch::optim::Optimizer>& optimizer_;  // Impl's: replaced on reset
  torch::Tensor param_;
};

// `samples` as the model's layers take them (Model::PrepareInputs); says how long that took when
// the model transforms them (scatter-linear: about 20 s of a core for a shard of Fashion-MNIST).
torch::Tensor Prepared(Model& model, const torch::Tensor& samples, const char* what) {
  const absl::Time start = absl::Now();
  torch::Tensor out = model.PrepareInputs(samples);
  if (!out.is_same(samples)) {
    LogInfo("the model's input features of the ", what, " (", samples.size(0), " samples) took ",
            absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(100))));
  }
  return out;
}

std::vector<torch::Tensor> Values(const std::vector<std::pair<std::string, torch::Tensor>>& items) {
  std::vector<torch::Tensor> out;
  out.reserve(items.size());
  for (const auto& item : items) out.push_back(item.second);
  return out;
}

}  // namespace

absl::Status TrainerOptions::Validate() const {
  if (absl::Status s = CheckModelName(spec.model(), /*torchscript_ok=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", s.message()));
  }
  if (spec.batch_size() < 1 || spec.batch_size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be in [1, 4096], got ", spec.batch_size()));
  }
  const auto& opt = spec.optimizer();
  if (opt.kind() != common::v1::OPTIMIZER_SGD && opt.kind() != common::v1::OPTIMIZER_ADAM) {
    return absl::InvalidArgumentError("optimizer.kind must be sgd or adam");
  }
  if (!(opt.learning_rate() > 0) || !std::isfinite(opt.learning_rate())) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.learning_rate must be > 0, got ", opt.learning_rate()));
  }
  if (!(opt.momentum() >= 0 && opt.momentum() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.momentum must be in [0, 1), got ", opt.momentum()));
  }
  if (absl::Status s = ValidateShardSpec(shard); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard: ", s.message()));
  }
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, got \"", device, "\""));
  }
  if (eval_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_batch_size must be >= 1, got ", eval_batch_size));
  }
  return absl::OkStatus();
}

struct Trainer::Impl {
  TrainerOptions options;
  torch::Device device{torch::kCPU};
  std::string script_path;  // model "torchscript": the file every peer holds a copy of
  std::unique_ptr<Model> model;
  int num_classes = 0;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  tensor::ModelLayout layout;
  tensor::ModelLayout state_layout;          // parameters, then float buffers
  torch::Tensor train_images, train_labels;  // on `device`
  torch::Tensor test_images, test_labels;    // on `device`
  std::vector<int64_t> order;                // permutation of [0, train_size) for the current epoch
  std::vector<uint64_t> label_histogram;     // training samples per class
  size_t cursor = 0;                         // next position in `order`
  uint64_t epoch = 0;
  bool touched = false;  // trained or set since it was built: no longer the fresh model
  // The parameters' gradient accumulators, each with a StepInBackward hook; held so that the
  // hooks stay (a variable keeps its accumulator only weakly).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  // privacy.dp level sample: every batch is a DP-SGD step (then no StepInBackward hooks).
  std::unique_ptr<DpSgdBatches> dp;

  EvalData EvalSet() const {
    return EvalData{test_images, test_labels, options.spec.loss(), num_classes,
                    options.eval_batch_size};
  }

  std::unique_ptr<torch::optim::Optimizer> MakeOptimizer() {
    const auto& opt = options.spec.optimizer();
    if (opt.kind() == common::v1::OPTIMIZER_ADAM) {
      return std::make_unique<torch::optim::Adam>(Values(model->NamedParameters()),
                                                  torch::optim::AdamOptions(opt.learning_rate()));
    }
    return std::make_unique<torch::optim::SGD>(
        Values(model->NamedParameters()),
        torch::optim::SGDOptions(opt.learning_rate()).momentum(opt.momentum()));
  }

  // Runs the model on one sample and checks that its output fits the loss and the classes, so
  // a mismatched model is refused before the peer joins rather than mid-round.
  absl::Status CheckOutputShape() {
    torch::NoGradGuard no_grad;
    torch::Tensor x = train_images.slice(0, 0, 1);
    model->SetTraining(false);
    torch::Tensor out;
    try {
      out = model->Forward(x);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model cannot take this data set's samples of shape [",
          absl::StrJoin(x.sizes().vec(), ", "), "]: ", TorchError("forward", e).message()));
    }
    model->SetTraining(true);
    return CheckOutputFits(options.spec.loss(), out, num_classes);
  }

  void NewEpoch() {
    order.resize(static_cast<size_t>(train_labels.size(0)));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    SeededShuffle(order, options.spec.seed() * 1000003ULL + options.shard.index * 7919ULL +
                             epoch * 104729ULL + 1);
    ++epoch;
    cursor = 0;
  }
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_RETURN_IF_ERROR(CheckDevice(options.device));
  if (data::UsesOwnFiles(options.spec.dataset())) {
    SHOAL_ASSIGN_OR_RETURN(
        data::TaskData own,
        data::LoadTaskData(options.spec.dataset(), options.data_dir, PartitionSeed(options.spec)));
    if (own.awaits_statistics) {
      if (!options.holds_all_data) {
        return absl::FailedPreconditionError(
            "dataset.normalization: standardize without dataset.mean and dataset.std uses the "
            "federation's statistics, which only the coordinator adds up; this run has no "
            "coordinator: give dataset.mean and dataset.std, or normalization standardize-local");
      }
      // All the task's data are here: the statistics of its training shard are the federation's.
      SHOAL_ASSIGN_OR_RETURN(const std::vector<int64_t> rows,
                             TrainShardIndices(options.spec, options.shard, own.train.labels,
                                               static_cast<int>(own.train.class_names.size())));
      SHOAL_ASSIGN_OR_RETURN(const data::FeatureMoments moments,
                             data::ComputeMoments(own.train, rows));
      SHOAL_ASSIGN_OR_RETURN(const data::FeatureStatistics stats,
                             data::StatisticsFromMoments(moments));
      SHOAL_RETURN_IF_ERROR(data::StandardizeTaskData(stats, own));
    }
    return Create(options, own.train, own.test);
  }
  SHOAL_ASSIGN_OR_RETURN(RawDataset train, LoadFashionMnist(options.data_dir, Split::kTrain));
  SHOAL_ASSIGN_OR_RETURN(RawDataset test, LoadFashionMnist(options.data_dir, Split::kTest));
  return Create(options, train, test);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                         const RawDataset& train,
                                                         const RawDataset& test) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_RETURN_IF_ERROR(CheckDevice(options.device));
  SHOAL_ASSIGN_OR_RETURN(ShardTensors data, MakeShardTensors(options, train, test));
  return Build(options, &data);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                         const data::Dataset& train,
                                                         const data::Dataset& test) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_RETURN_IF_ERROR(CheckDevice(options.device));
  SHOAL_ASSIGN_OR_RETURN(ShardTensors data, MakeShardTensors(options, train, test));
  return Build(options, &data);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Build(const TrainerOptions& options,
                                                        ShardTensors* data) {
  UseOneBlasThreadPerCall();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.spec.model() == kTorchScriptModel) {
    impl->script_path = task::ModelFilePath(options.spec, options.model_dir);
    SHOAL_RETURN_IF_ERROR(task::CheckModelFile(options.spec, impl->script_path));
  }
  impl->num_classes = data->num_classes;
  impl->label_histogram = std::move(data->label_histogram);
  try {
    impl->device =
        options.device == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
    SHOAL_ASSIGN_OR_RETURN(impl->model, LoadModel(options.spec, impl->script_path));
    impl->model->To(impl->device);
    SHOAL_ASSIGN_OR_RETURN(impl->layout, LayoutOf(*impl->model));
    SHOAL_ASSIGN_OR_RETURN(impl->state_layout, StateLayoutOf(*impl->model));
    impl->optimizer = impl->MakeOptimizer();
    const bool dp_sgd = task::HasSampleDp(options.spec);
    for (auto& [name, p] : impl->model->NamedParameters()) {
      if (dp_sgd || !options.step_in_backward || !p.requires_grad()) continue;
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(p);
      accumulator->add_post_hook(std::make_unique<StepInBackward>(impl->optimizer, p));
      impl->accumulators.push_back(std::move(accumulator));
    }
    impl->train_images = Prepared(*impl->model, data->train_x, "training shard").to(impl->device);
    impl->train_labels = data->train_y.to(impl->device);
    impl->test_images = Prepared(*impl->model, data->test_x, "test slice").to(impl->device);
    impl->test_labels = data->test_y.to(impl->device);
    *data = ShardTensors();  // the host copies are not needed once on the device
    impl->NewEpoch();
    if (dp_sgd) {
      SHOAL_ASSIGN_OR_RETURN(impl->dp,
                             DpSgdBatches::Create(options.spec, *impl->model, impl->num_classes,
                                                  impl->train_labels.size(0)));
    }
  } catch (const std::exception& e) {
    return TorchError("creating trainer", e);
  }
  SHOAL_RETURN_IF_ERROR(impl->CheckOutputShape());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::StatusOr<TrainStats> Trainer::TrainBatches(uint32_t n,
                                                 const std::function<bool()>& keep_going) {
  Impl& m = *impl_;
  m.touched = true;
  const size_t batch = m.options.spec.batch_size();
  TrainStats stats;
  const absl::Time start = absl::Now();
  double loss_total = 0;
  absl::Cleanup release = [&m] { ReleaseGradients(*m.model); };
  try {
    m.model->SetTraining(true);
    for (uint32_t b = 0; b < n; ++b) {
      if (keep_going && !keep_going()) {
        return absl::CancelledError(
            absl::StrCat("training stopped after ", b, " of ", n, " batches"));
      }
      if (m.dp) {  // DP-SGD: a Poisson batch, clipped per sample, with noise (dp_batches.h)
        ReleaseGradients(*m.model);
        SHOAL_ASSIGN_OR_RETURN(DpBatchStats step, m.dp->Step(m.train_images, m.train_labels));
        m.optimizer->step();
        if (!std::isfinite(step.loss)) {
          return absl::InternalError(
              absl::StrCat("training diverged: loss is ", step.loss, " at batch ", b));
        }
        loss_total += step.loss;
        stats.samples += static_cast<uint64_t>(step.samples);
        ++stats.batches;
        if (m.options.after_batch) m.options.after_batch(keep_going);
        continue;
      }
      // Every batch is full: the tail of an epoch smaller than a batch is skipped (it is part
      // of the next epoch's shuffle), so a round trains exactly n * batch_size samples. A shard
      // smaller than one batch is trained whole.
      if (m.cursor + std::min(batch, m.order.size()) > m.order.size()) m.NewEpoch();
      const size_t take = std::min(batch, m.order.size() - m.cursor);
      torch::Tensor idx =
          torch::from_blob(m.order.data() + m.cursor, {static_cast<int64_t>(take)}, torch::kInt64)
              .to(m.device);
      m.cursor += take;
      torch::Tensor x = m.train_images.index_select(0, idx);
      torch::Tensor y = m.train_labels.index_select(0, idx);
      ReleaseGradients(*m.model);
      torch::Tensor loss = TaskLoss(m.options.spec.loss(), m.model->Forward(x), y, m.num_classes);
      loss.backward();  // with step_in_backward: steps the optimizer (StepInBackward)
      if (!m.options.step_in_backward) m.optimizer->step();
      const double l = loss.item<double>();
      if (!std::isfinite(l)) {
        return absl::InternalError(absl::StrCat("training diverged: loss is ", l, " at batch ", b));
      }
      loss_total += l;
      stats.samples += take;
      ++stats.batches;
      if (m.options.after_batch) m.options.after_batch(keep_going);
    }
  } catch (const std::exception& e) {
    return TorchError("training", e);
  }
  stats.mean_loss = stats.batches == 0 ? 0 : loss_total / stats.batches;
  stats.duration = absl::Now() - start;
  return stats;
}

absl::StatusOr<EvalStats> Trainer::Evaluate() {
  const Impl& m = *impl_;
  return EvaluateModel(*m.model, m.EvalSet(), nullptr);
}

absl::StatusOr<std::unique_ptr<ModelEvaluator>> Trainer::MakeEvaluator() const {
  const Impl& m = *impl_;
  auto impl = std::make_unique<ModelEvaluator::Impl>();
  impl->data = m.EvalSet();
  impl->params_layout = m.layout;
  impl->state_layout = m.state_layout;
  impl->on_cpu = m.device.is_cpu();
  try {
    SHOAL_ASSIGN_OR_RETURN(impl->model, LoadModel(m.options.spec, m.script_path));
    impl->model->To(m.device);
    if (impl->on_cpu) {
      // Its parameters are views of the state each evaluation is given: it holds none.
      torch::NoGradGuard no_grad;
      for (auto& [name, p] : impl->model->NamedParameters()) p.set_data(torch::empty({0}));
    }
  } catch (const std::exception& e) {
    return TorchError("creating an evaluator", e);
  }
  return std::unique_ptr<ModelEvaluator>(new ModelEvaluator(std::move(impl)));
}

absl::StatusOr<tensor::FlatModel> Trainer::GetParameters(std::vector<float> buffer) const {
  return GetState(/*include_buffers=*/false, std::move(buffer));
}

absl::Status Trainer::SetParameters(const tensor::FlatModel& model) {
  if (!(model.layout == impl_->layout)) {
    return absl::InvalidArgumentError(absl::StrCat("model layout ", model.layout.DebugString(),
                                                   " does not match this task's model ",
                                                   impl_->layout.DebugString()));
  }
  return SetState(model);
}

absl::StatusOr<tensor::FlatModel> Trainer::InitialParameters() const {
  return InitialState(/*include_buffers=*/false);
}

absl::StatusOr<tensor::FlatModel> Trainer::InitialState(bool include_buffers) const {
  // Untouched, the model is the fresh one: no second model in memory (a peer uploading a large
  // initial model would hold three).
  if (!impl_->touched) return GetState(include_buffers);
  try {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> fresh,
                           LoadModel(impl_->options.spec, impl_->script_path));
    return FlattenState(*fresh, state_layout(include_buffers), impl_->layout);
  } catch (const std::exception& e) {
    return TorchError("building the initial model", e);
  }
}

struct TrainerProgress::Data {
  std::string optimizer;  // torch::serialize archive of the optimizer's state
  std::vector<int64_t> order;
  size_t cursor = 0;
  uint64_t epoch = 0;
};

TrainerProgress::TrainerProgress() = default;
TrainerProgress::~TrainerProgress() = default;
TrainerProgress::TrainerProgress(TrainerProgress&&) noexcept = default;
TrainerProgress& TrainerProgress::operator=(TrainerProgress&&) noexcept = default;

absl::StatusOr<TrainerProgress> Trainer::SaveProgress() const {
  TrainerProgress progress;
  progress.data_ = std::make_unique<TrainerProgress::Data>();
  try {
    torch::serialize::OutputArchive archive;
    impl_->optimizer->save(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    progress.data_->optimizer = std::move(bytes).str();
  } catch (const std::exception& e) {
    return TorchError("saving the optimizer state", e);
  }
  progress.data_->order = impl_->order;
  progress.data_->cursor = impl_->cursor;
  progress.data_->epoch = impl_->epoch;
  return progress;
}

absl::Status Trainer::RestoreProgress(const TrainerProgress& progress) {
  if (progress.data_ == nullptr) return absl::InvalidArgumentError("empty trainer progress");
  try {
    std::istringstream bytes(progress.data_->optimizer);
    torch::serialize::InputArchive archive;
    archive.load_from(bytes);
    impl_->optimizer = impl_->MakeOptimizer();
    impl_->optimizer->load(archive);
  } catch (const std::exception& e) {
    return TorchError("restoring the optimizer state", e);
  }
  impl_->order = progress.data_->order;
  impl_->cursor = progress.data_->cursor;
  impl_->epoch = progress.data_->epoch;
  return absl::OkStatus();
}

absl::Status Trainer::ResetOptimizer() {
  try {
    impl_->optimizer = impl_->MakeOptimizer();
  } catch (const std::exception& e) {
    return TorchError("resetting the optimizer", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<tensor::FlatModel> Trainer::GetState(bool include_buffers,
                                                    std::vector<float> buffer) const {
  try {
    return FlattenState(*impl_->model, state_layout(include_buffers), impl_->layout,
                        std::move(buffer));
  } catch (const std::exception& e) {
    return TorchError("reading the model's state", e);
  }
}

absl::Status Trainer::SetState(const tensor::FlatModel& state) {
  if (state.values.size() != state.layout.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model has ", state.values.size(), " values, its layout ", state.layout.total_elements()));
  }
  // The values straight from `state` (no copy of them: the model may be large).
  return SetStateFrom(state.layout, ReadFromMemory(state.values));
}

absl::Status Trainer::SetStateFrom(const tensor::ModelLayout& layout,
                                   const tensor::ReadValues& read) {
  Impl& m = *impl_;
  if (!(layout == m.layout || layout == m.state_layout)) {
    return absl::InvalidArgumentError(absl::StrCat("model state layout ", layout.DebugString(),
                                                   " does not match this task's model ",
                                                   m.state_layout.DebugString()));
  }
  m.touched = true;
  try {
    return LoadState(*m.model, layout, m.layout, read);
  } catch (const std::exception& e) {
    return TorchError("setting the model's state", e);
  }
}

const tensor::ModelLayout& Trainer::state_layout(bool include_buffers) const {
  return include_buffers ? impl_->state_layout : impl_->layout;
}

const tensor::ModelLayout& Trainer::layout() const { return impl_->layout; }
size_t Trainer::train_size() const { return static_cast<size_t>(impl_->train_labels.size(0)); }
size_t Trainer::test_size() const { return static_cast<size_t>(impl_->test_labels.size(0)); }
std::string Trainer::PrivacyDescription() const {
  return impl_->dp ? impl_->dp->Describe() : std::string();
}

const std::vector<uint64_t>& Trainer::label_histogram() const { return impl_->label_histogram; }

absl::Status SetTorchThreads(int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("torch threads must be >= 1, got ", threads));
  }
  try {
    torch::set_num_threads(threads);
  } catch (const std::exception& e) {
    return TorchError("setting torch threads", e);
  }
  return absl::OkStatus();
}

absl::Status CheckDevice(const std::string& device) {
  if (device == "cpu") return absl::OkStatus();
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device \"", device, "\" (known: cpu, cuda)"));
  }
  try {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          "device cuda requested but no CUDA device is available to LibTorch (this build of "
          "LibTorch may be CPU-only)");
    }
  } catch (const std::exception& e) {
    return TorchError("checking for CUDA", e);
  }
  return absl::OkStatus();
}

}  // namespace shoal::training
