#include "services/peer_agent/modes/federated_sync/background_evaluator.h"

#include <utility>

#include "absl/strings/str_cat.h"
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
  bool unevaluated = false;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    unevaluated = job_.has_value() || evaluating_;
    job_.reset();
  }
  thread_.join();
  if (unevaluated) {
    LogInfo("task ", task_, ": the last published model is left unevaluated (task over)");
  }
}

void BackgroundEvaluator::Submit(uint64_t round, uint64_t version,
                                 std::weak_ptr<const tensor::FlatModel> copy, ModelOnDisk on_disk) {
  WaitUntilDone();
  absl::MutexLock lock(&mu_);
  job_ = Job{round, version, std::move(copy), std::move(on_disk)};
}

void BackgroundEvaluator::Pause() {
  absl::MutexLock lock(&mu_);
  paused_ = true;
  mu_.Await(absl::Condition(this, &BackgroundEvaluator::LetGo));
}

void BackgroundEvaluator::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
}

absl::Duration BackgroundEvaluator::WaitUntilDone() {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  if (Done()) return absl::ZeroDuration();
  paused_ = false;
  mu_.Await(absl::Condition(this, &BackgroundEvaluator::Done));
  return absl::Now() - start;
}

bool BackgroundEvaluator::NextBatch() {
  absl::MutexLock lock(&mu_);
  return !paused_ && !stopping_;
}

absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> BackgroundEvaluator::Take(
    const Job& job) const {
  if (std::shared_ptr<const tensor::FlatModel> copy = job.copy.lock()) return copy;
  // Memory of its own, for as long as this stretch of the evaluation lasts: a model this size
  // is mapped fresh and goes back to the system when freed.
  auto model = std::make_shared<tensor::FlatModel>();
  model->layout = job.on_disk.layout;
  model->values.resize(job.on_disk.layout.total_elements());
  if (absl::Status s = job.on_disk.values->Read(absl::MakeSpan(model->values)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("reading model version ", job.version,
                                               " back from disk: ", s.message()));
  }
  return model;
}

std::optional<absl::StatusOr<training::EvalStats>> BackgroundEvaluator::Evaluate(const Job& job) {
  training::EvalStats so_far;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &BackgroundEvaluator::MayEvaluate));
      if (stopping_) return std::nullopt;
      holding_ = true;  // before the model is taken: Pause() waits until it is let go again
    }
    absl::StatusOr<training::EvalStats> eval;
    {
      absl::StatusOr<std::shared_ptr<const tensor::FlatModel>> model = Take(job);
      eval = model.ok() ? evaluator_->Evaluate(
                              **model, [this] { return NextBatch(); }, &so_far)
                        : model.status();
    }  // the model let go of: the copy's owner decides when it goes, the read one goes now
    absl::MutexLock lock(&mu_);
    holding_ = false;
    if (!absl::IsCancelled(eval.status())) return eval;
    if (stopping_) return std::nullopt;
    // Paused: it goes on from `so_far` once resumed.
  }
}

void BackgroundEvaluator::Run() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &BackgroundEvaluator::HasWork));
      if (stopping_) return;
      job = *std::move(job_);
      job_.reset();
      evaluating_ = true;
    }
    std::optional<absl::StatusOr<training::EvalStats>> eval = Evaluate(job);
    const uint64_t round = job.round;
    const uint64_t version = job.version;
    job = Job{};  // the file on disk too, once the peer holds another version
    if (!eval) return;
    ReportEvaluation(task_, round, version, *eval, metrics_, send_);
    absl::MutexLock lock(&mu_);
    evaluating_ = false;
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
