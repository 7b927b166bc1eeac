#include "services/peer_agent/modes/federated_sync/background_evaluator.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "services/peer_agent/reports.h"

namespace shoal::peer {

absl::StatusOr<std::unique_ptr<BackgroundEvaluator>> BackgroundEvaluator::Create(
    const training::Trainer& trainer, std::string task, PeerMetrics& metrics, SendFn send) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<training::ModelEvaluator> evaluator,
                         trainer.MakeEvaluator());
  return std::unique_ptr<BackgroundEvaluator>(
      new BackgroundEvaluator(std::move(evaluator), std::move(task), metrics, std::move(send)));
}

BackgroundEvaluator::BackgroundEvaluator(std::unique_ptr<training::ModelEvaluator> evaluator,
                                         std::string task, PeerMetrics& metrics, SendFn send)
    : evaluator_(std::move(evaluator)),
      task_(std::move(task)),
      metrics_(metrics),
      send_(std::move(send)),
      thread_([this] { Run(); }) {}

BackgroundEvaluator::~BackgroundEvaluator() {
  size_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped = queue_.size();
    queue_.clear();
  }
  thread_.join();
  if (dropped > 0) {
    LogInfo("task ", task_, ": ", dropped, " published model(s) left unevaluated (task over)");
  }
}

void BackgroundEvaluator::Submit(uint64_t round, uint64_t version,
                                 std::shared_ptr<const tensor::FlatModel> model) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Job{round, version, std::move(model)});
}

bool BackgroundEvaluator::HasWork() const { return stopping_ || !queue_.empty(); }

void BackgroundEvaluator::SetTraining(bool training) {
  absl::MutexLock lock(&mu_);
  training_ = training;
}

bool BackgroundEvaluator::MayEvaluate() const { return stopping_ || !training_ || !queue_.empty(); }

bool BackgroundEvaluator::NextBatch() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &BackgroundEvaluator::MayEvaluate));
  return !stopping_;
}

bool BackgroundEvaluator::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void BackgroundEvaluator::Run() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &BackgroundEvaluator::HasWork));
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::StatusOr<training::EvalStats> eval =
        evaluator_->Evaluate(*job.model, [this] { return NextBatch(); });
    job.model.reset();  // the snapshot may be gone by now: its memory goes back at once
    if (absl::IsCancelled(eval.status()) && Stopping()) return;
    ReportEvaluation(task_, job.round, job.version, eval, metrics_, send_);
  }
}

void ReportEvaluation(const std::string& task, uint64_t round, uint64_t version,
                      const absl::StatusOr<training::EvalStats>& eval, PeerMetrics& metrics,
                      const std::function<void(const coordinator::v1::PeerMessage&)>& send) {
  if (!eval.ok()) {
    LogError("task ", task, ": evaluating version ", version, ": ", eval.status().message());
    send(MakePeerError(round, eval.status()));
    return;
  }
  metrics.test_accuracy.Set(eval->accuracy());
  LogInfo(absl::StrFormat("task %s round %d: model version %d test accuracy %.4f (%d/%d)", task,
                          round, version, eval->accuracy(), eval->correct, eval->total));
  send(MakeEvalReport(version, *eval));
}

}  // namespace shoal::peer
