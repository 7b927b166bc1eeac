#pragma once

// Torch-free interface of ModelEvaluator: evaluating a model beside the trainer's training.

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/trainer.h"

namespace shoal::training {

// A second instance of a task's model (Trainer::MakeEvaluator) that evaluates a given state on
// the trainer's test slice, on a thread other than the trainer's: the test slice is shared and
// only read, the model is its own. On the CPU its parameters and buffers are, for the length of
// one Evaluate(), views of the state evaluated (no copy), and it holds no model memory between
// calls; on a GPU the state is copied into its own parameters. Not thread-safe: one thread at a
// time drives it. Exceptions from LibTorch never escape.
class ModelEvaluator {
 public:
  ~ModelEvaluator();
  ModelEvaluator(const ModelEvaluator&) = delete;
  ModelEvaluator& operator=(const ModelEvaluator&) = delete;

  // What Trainer::Evaluate() reports with its state set to `state` (the same batches through the
  // same code): parameters, and float buffers when `state` carries them (GetState).
  // `keep_going` is asked before each batch: CANCELLED once it is false. Errors:
  // INVALID_ARGUMENT a layout that is not the task's model's.
  // Stopped and resumed: with `so_far`, the evaluation begins after the first `so_far->total`
  // test samples and adds each batch's counts into `*so_far` as it goes, so that an evaluation
  // stopped part way (CANCELLED) goes on in a later call given the same `so_far` (and the same
  // state, which may be another copy of it) and ends with exactly the numbers of one pass.
  absl::StatusOr<EvalStats> Evaluate(const tensor::FlatModel& state,
                                     const std::function<bool()>& keep_going,
                                     EvalStats* so_far = nullptr);

 private:
  friend class Trainer;
  struct Impl;  // model_evaluation.h
  explicit ModelEvaluator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal::training
