#pragma once

// Torch-free interface of the trainer: the peer agent includes only this header.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/data/dataset.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/model_names.h"
#include "libs/training/partition.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::training {

struct ShardTensors;   // shard_tensors.h (LibTorch)
class ModelEvaluator;  // model_evaluator.h

struct TrainerOptions {
  common::v1::TaskSpec spec;  // model, dataset, batch_size, optimizer, seed
  std::string data_dir;       // Fashion-MNIST's .gz files, or the task's own files
  // Where a relative TaskSpec.torchscript.file is found (shoal-peer --model-dir); empty: the
  // working directory.
  std::string model_dir;
  ShardSpec shard;
  std::string device = "cpu";  // "cpu" or "cuda"
  // Samples per forward pass in Evaluate(). Small batches keep the convolutions' working set in
  // cache (1000 was about 15% slower per sample than 128 on the 2-core dev machine).
  int eval_batch_size = 128;
  // Called after every batch TrainBatches() trains, with that call's keep_going; null: nothing.
  // It may block (the peer's after-batch hook: shoal-peer-testing --test-slow-batch pauses
  // here, to play a slow peer) and should return early once keep_going turns false;
  // TrainBatches asks keep_going again before the next batch.
  std::function<void(const std::function<bool()>& keep_going)> after_batch;
  // true: the optimizer steps each parameter inside backward() as soon as its gradient is
  // complete and frees that gradient, so at most one parameter's gradient exists at a time
  // (a peer's peak memory: parameters, momentum and the largest gradient). false: one step after
  // backward(), all gradients held at once. Both give the same parameters (a test checks it).
  bool step_in_backward = true;
  // Create(options) on a task whose data need the federation's statistics (normalization
  // standardize without the task's mean/std): true for a process that holds all of the task's
  // data (shoal-train's centralized baseline), whose own training statistics are the
  // federation's; false: FAILED_PRECONDITION (only the coordinator adds the peers' up; a peer
  // standardises before it creates its trainer).
  bool holds_all_data = false;

  // INVALID_ARGUMENT naming the field: unknown model, batch_size, optimizer, shard, device.
  absl::Status Validate() const;
};

struct TrainStats {
  double mean_loss = 0;  // mean of the batches' mean losses
  uint64_t samples = 0;  // samples trained
  uint32_t batches = 0;
  absl::Duration duration;  // wall time, from the first batch to the last one's step
};

struct EvalStats {
  uint64_t correct = 0;
  uint64_t total = 0;
  double loss_sum = 0;  // sum of per-sample cross-entropy losses
  double accuracy() const { return total == 0 ? 0 : static_cast<double>(correct) / total; }
};

// What training changes besides the parameters: the optimizer's state (e.g. momentum) and the
// position in the shuffled data. Saved before work that may be thrown away (a decentralized round
// the peer has to leave and train again) and restored with the parameters, so that the discarded
// work leaves no trace and the same round trains the same way again. Opaque; movable.
class TrainerProgress {
 public:
  TrainerProgress();
  ~TrainerProgress();
  TrainerProgress(TrainerProgress&&) noexcept;
  TrainerProgress& operator=(TrainerProgress&&) noexcept;

 private:
  friend class Trainer;
  struct Data;
  std::unique_ptr<Data> data_;
};

// Owns one model, its optimizer and this peer's data (training shard and test slice) for one
// task. Deterministic for a given spec, shard and seed, except with privacy.dp at level sample:
// then each batch is a DP-SGD step (dp_batches.h) whose sampling and noise come from the
// system's entropy, and Create refuses a model without per-sample gradients
// (FAILED_PRECONDITION naming its batch normalisation layer). Not thread-safe: one thread (the
// agent's worker) drives it. Exceptions from LibTorch never escape; they become absl::Status.
class Trainer {
 public:
  // Loads the data from options.data_dir: Fashion-MNIST, or the task's own files
  // (data::LoadTaskData). Errors: INVALID_ARGUMENT bad options or model name,
  // NOT_FOUND / INVALID_ARGUMENT from the dataset loader, FAILED_PRECONDITION cuda unavailable.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);
  // Same, from datasets already in memory (full splits; limits and partition are applied here).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                         const RawDataset& train,
                                                         const RawDataset& test);
  // Same, from a data set of the peer's own files (data::LoadTaskData): limits and partition
  // apply to `train` as above (a peer without --shard has shard 0/1: all of it), and `test` is
  // sliced by the shard. The model's output must fit the data's classes and the task's loss
  // (INVALID_ARGUMENT naming both shapes).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                         const data::Dataset& train,
                                                         const data::Dataset& test);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains `n` batches of spec.batch_size samples (n * batch_size samples unless the shard is
  // smaller than a batch), cycling through the shard: reshuffled with a seed at every epoch, an
  // incomplete last batch of an epoch skipped, the position carried over between calls. With
  // DP-SGD each batch is a Poisson draw of batch_size samples on average instead.
  // `keep_going` is asked before each batch; when it returns false the call stops and returns
  // CANCELLED. The gradients are freed when it returns (they take no memory between calls).
  absl::StatusOr<TrainStats> TrainBatches(uint32_t n, const std::function<bool()>& keep_going);

  // Evaluates the current parameters on this shard's test slice (test indices i % N == I).
  absl::StatusOr<EvalStats> Evaluate();
  // A second instance of this task's model that evaluates a given state on the same test slice
  // on another thread, beside this trainer's training (ModelEvaluator). The trainer must outlive
  // it. Errors: from building the model (as Create).
  absl::StatusOr<std::unique_ptr<ModelEvaluator>> MakeEvaluator() const;

  // The current parameters, flattened in the model's registration order, into `buffer`'s storage
  // (as FlattenState).
  absl::StatusOr<tensor::FlatModel> GetParameters(std::vector<float> buffer = {}) const;
  // Replaces the parameters. Errors: INVALID_ARGUMENT when `model`'s layout differs.
  absl::Status SetParameters(const tensor::FlatModel& model);
  // The parameters a fresh model built from spec.seed has.
  absl::StatusOr<tensor::FlatModel> InitialParameters() const;
  // The same with, when `include_buffers`, the fresh model's float buffers (GetState): what the
  // federated modes' InitializeModel uploads.
  absl::StatusOr<tensor::FlatModel> InitialState(bool include_buffers) const;
  // Forgets optimizer state (e.g. momentum).
  absl::Status ResetOptimizer();
  // The optimizer's state and the data position now; Restore() goes back to them (the caller
  // restores the parameters it holds).
  absl::StatusOr<TrainerProgress> SaveProgress() const;
  absl::Status RestoreProgress(const TrainerProgress& progress);

  // The parameters and, when `include_buffers`, then the model's float buffers (e.g. batch-norm
  // running statistics) named "buffer:<name>": what the federated modes exchange through the
  // aggregator (buffers always) and gossip (GossipSpec.include_buffers). Without buffers (or for
  // a model that has none, like the built-in mlp and cnn) this equals GetParameters(). Into
  // `buffer`'s storage, as GetParameters.
  absl::StatusOr<tensor::FlatModel> GetState(bool include_buffers,
                                             std::vector<float> buffer = {}) const;
  // Replaces what GetState() returned; the layout tells whether buffers are included.
  // Errors: INVALID_ARGUMENT when the layout is neither state_layout(false) nor (true).
  absl::Status SetState(const tensor::FlatModel& state);
  // The same from values held elsewhere (e.g. a downloaded model in a file), read by `read`
  // straight into the parameters' memory on the CPU: no model-sized buffer. An error from
  // `read` leaves the state partly replaced.
  absl::Status SetStateFrom(const tensor::ModelLayout& layout, const tensor::ReadValues& read);
  const tensor::ModelLayout& state_layout(bool include_buffers) const;

  const tensor::ModelLayout& layout() const;
  size_t train_size() const;  // samples in the training shard
  size_t test_size() const;   // samples in the test slice
  // Training samples of the shard per class, class 0 first.
  const std::vector<uint64_t>& label_histogram() const;
  // With privacy.dp at level sample, how each step trains, for the peer's log ("DP-SGD:
  // Poisson batches at q 0.032, clip_norm 1, ..."); empty otherwise.
  std::string PrivacyDescription() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  // Both Create()s end here: the model, the optimizer and the data on the device.
  static absl::StatusOr<std::unique_ptr<Trainer>> Build(const TrainerOptions& options,
                                                        ShardTensors* data);
  std::unique_ptr<Impl> impl_;
};

// Writes `model`'s parameters, and its float buffers when its layout carries them (GetState),
// into a copy of the task's TorchScript file (found through
// `model_dir` like TrainerOptions::model_dir, and checked against the task's digest) at
// `out_path`, so that torch.jit.load(out_path) in PyTorch gives the trained model. Errors:
// FAILED_PRECONDITION a task with a built-in model or a model file with another digest;
// INVALID_ARGUMENT a model whose layout is not the file's; NOT_FOUND a missing file.
absl::Status WriteTorchScript(const common::v1::TaskSpec& spec, const std::string& model_dir,
                              const tensor::FlatModel& model, const std::string& out_path);

// Sets LibTorch's intra-op thread count (process-wide). Errors: INVALID_ARGUMENT when < 1.
absl::Status SetTorchThreads(int threads);

// OK for "cpu", and for "cuda" when a CUDA device is available. Errors: INVALID_ARGUMENT unknown
// device; FAILED_PRECONDITION cuda requested but unavailable.
absl::Status CheckDevice(const std::string& device);

}  // namespace shoal::training
