#pragma once

// Evaluating published models beside training (federated-sync, peer side).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/model_evaluator.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/modes/aggregator_peer.h"
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
// the model evaluated), while the peer's worker goes on, without raising the peer's memory above
// what its training takes (3x the model): the evaluation holds a model in memory only while the
// worker does not train and push (Pause), and the worker makes no copy of a new model while an
// evaluation is under way (WaitUntilDone). It evaluates the snapshot's copy of the model while
// that copy is there (it keeps no reference of its own to it, so the copy goes when the snapshot
// does), else the model as the peer holds it on disk, read into memory of its own, which it lets
// go of whenever it pauses; after a pause it goes on where it stopped, and its numbers are
// exactly those of one pass (ModelEvaluator::Evaluate's `so_far`). One model at a time; each
// result goes out through ReportEvaluation. `send` is called on this class's thread (the
// session's send is thread-safe). The other calls come from one thread (the runner's worker).
class BackgroundEvaluator {
 public:
  using SendFn = std::function<void(const coordinator::v1::PeerMessage&)>;

  // Errors: from building the evaluator's model (Trainer::MakeEvaluator).
  static absl::StatusOr<std::unique_ptr<BackgroundEvaluator>> Create(
      const training::Trainer& trainer, std::string task, PeerMetrics& metrics, SendFn send);
  // Stops: the evaluation under way ends at its next batch and reports nothing (logged), and the
  // thread is joined.
  ~BackgroundEvaluator();
  BackgroundEvaluator(const BackgroundEvaluator&) = delete;
  BackgroundEvaluator& operator=(const BackgroundEvaluator&) = delete;

  // Hands over model `version`, published at the end of round `round`, for evaluation: `copy`
  // while it lasts (the caller must not change it), `on_disk` (the same values) after. Waits
  // first for the evaluation handed over before to end (WaitUntilDone).
  void Submit(uint64_t round, uint64_t version, std::weak_ptr<const tensor::FlatModel> copy,
              ModelOnDisk on_disk);
  // The worker is about to train and push: returns once the evaluation under way (if any) has
  // stopped at a batch's end and let go of the model it held, which takes at most a batch (or
  // the read of the model from disk). Until Resume() no evaluation runs.
  void Pause();
  void Resume();
  // Waits until the model handed over last has been evaluated and its result sent (the worker
  // does not train meanwhile: an evaluation paused then goes on). Returns how long it waited.
  absl::Duration WaitUntilDone();

 private:
  struct Job {
    uint64_t round = 0;
    uint64_t version = 0;
    std::weak_ptr<const tensor::FlatModel> copy;
    ModelOnDisk on_disk;
  };

  BackgroundEvaluator(std::unique_ptr<training::ModelEvaluator> evaluator, std::string task,
                      PeerMetrics& metrics, SendFn send);
  void Run();
  // Evaluates `job` to its end, pausing as asked; nullopt once stopping.
  std::optional<absl::StatusOr<training::EvalStats>> Evaluate(const Job& job);
  // The model to evaluate: the copy while it lasts, else read from disk.
  absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> Take(const Job& job) const;
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || job_.has_value(); }
  bool MayEvaluate() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !paused_; }
  bool LetGo() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !holding_; }
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (!job_ && !evaluating_);
  }
  // Before each batch: false once paused or stopping (the evaluation stops there).
  bool NextBatch() ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<training::ModelEvaluator> evaluator_;  // this class's thread only
  const std::string task_;
  PeerMetrics& metrics_;
  const SendFn send_;
  mutable absl::Mutex mu_;
  std::optional<Job> job_ ABSL_GUARDED_BY(mu_);   // handed over, not yet taken
  bool evaluating_ ABSL_GUARDED_BY(mu_) = false;  // a job taken and not yet reported
  bool holding_ ABSL_GUARDED_BY(mu_) = false;     // a model in memory is evaluated now
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once everything else is ready
};

}  // namespace shoal::peer
