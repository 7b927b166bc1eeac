#pragma once

// Evaluating published models beside training (federated-sync, peer side).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/model_evaluator.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/peer_metrics.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

// What the evaluation of model `version`, published at the end of round `round`, reports: the
// test-accuracy metric, the log line "task T round R: model version V test accuracy A (C/N)" and
// an EvalReport for V, or on error a log line and a PeerError for round R. The same whether the
// model is evaluated beside training (BackgroundEvaluator) or before it (FederatedSyncRunner).
void ReportEvaluation(const std::string& task, uint64_t round, uint64_t version,
                      const absl::StatusOr<training::EvalStats>& eval, PeerMetrics& metrics,
                      const std::function<void(const coordinator::v1::PeerMessage&)>& send);

// Evaluates each model a federated-sync peer is published on a thread of its own (with a
// training::ModelEvaluator, a second instance of the task's model whose parameters are views of
// the model evaluated), so that the peer's worker trains the next round meanwhile instead of
// after the evaluation. Models are evaluated one at a time in the order submitted; each one's
// result goes out through ReportEvaluation. `send` is called on this class's thread (the
// session's send is thread-safe). Submit() is called from one thread (the runner's worker).
class BackgroundEvaluator {
 public:
  using SendFn = std::function<void(const coordinator::v1::PeerMessage&)>;

  // Errors: from building the evaluator's model (Trainer::MakeEvaluator).
  static absl::StatusOr<std::unique_ptr<BackgroundEvaluator>> Create(
      const training::Trainer& trainer, std::string task, PeerMetrics& metrics, SendFn send);
  // Stops: the evaluation under way ends at its next batch and reports nothing, those still
  // queued are dropped (logged), and the thread is joined.
  ~BackgroundEvaluator();
  BackgroundEvaluator(const BackgroundEvaluator&) = delete;
  BackgroundEvaluator& operator=(const BackgroundEvaluator&) = delete;

  // Queues model `version`, published at the end of round `round`, for evaluation. `model` is
  // kept (not copied) until its evaluation ends: the caller must not change it.
  void Submit(uint64_t round, uint64_t version, std::shared_ptr<const tensor::FlatModel> model);
  // The worker trains and makes its delta (true), or is done with that (false). Meanwhile the
  // evaluation under way waits before its next batch, so that the two do not share the cores (the
  // round's training is on its critical path, the evaluation is not): it runs while the worker
  // downloads, pushes and waits for the next round. Unless another model is queued behind it:
  // then the evaluations are a round behind and go on beside training, so they never fall
  // further behind.
  void SetTraining(bool training);

 private:
  struct Job {
    uint64_t round = 0;
    uint64_t version = 0;
    std::shared_ptr<const tensor::FlatModel> model;
  };

  BackgroundEvaluator(std::unique_ptr<training::ModelEvaluator> evaluator, std::string task,
                      PeerMetrics& metrics, SendFn send);
  void Run();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool MayEvaluate() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before each batch of an evaluation: waits while it should yield to training (SetTraining);
  // false once stopping.
  bool NextBatch() ABSL_LOCKS_EXCLUDED(mu_);
  bool Stopping() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<training::ModelEvaluator> evaluator_;  // this class's thread only
  const std::string task_;
  PeerMetrics& metrics_;
  const SendFn send_;
  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool training_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once everything else is ready
};

}  // namespace shoal::peer
