#include "services/coordinator/modes/federated_async/federated_async_task.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/async_spec.h"
#include "libs/common/log.h"
#include "libs/task/task_federated.h"

namespace shoal::coordinator {

using Kind = AggregatorWork::Kind;

FederatedAsyncTask::FederatedAsyncTask(const v1::TaskStatus& status, const ModeOptions& options,
                                       CoordinatorMetrics& metrics)
    : AggregatorModeTask(status, options, metrics), tree_(task::IsHierarchical(status.spec())) {
  for (const v1::PeerProgress& p : status.peers()) contributions_[p.peer_id()] = p.updates();
}

void FederatedAsyncTask::AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
                                 ModeEffects& fx) {
  peers_.insert(peer.id);
  if (tree_ && (buffer_open_ || opening_)) {
    // Its cluster's buffer may not be open yet, and the others' sizes change: it trains once
    // the tree's buffers are opened again.
    joined_.insert(peer.id);
    reopen_ = true;
  } else if (buffer_open_) {
    fx.Send(peer.id, TrainEvent(status));  // it starts training at once
  }
  Advance(now, status, fx);
}

void FederatedAsyncTask::RemovePeer(const std::string& peer_id, const std::string& why,
                                    absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  joined_.erase(peer_id);
  // Its cluster's buffer would wait for it: the sizes change.
  if (tree_ && (buffer_open_ || opening_)) reopen_ = true;
  AggregatorModeTask::RemovePeer(peer_id, why, now, status, fx);
}

void FederatedAsyncTask::Reset(v1::TaskStatus& status) {
  opening_ = false;
  reopen_ = false;
  joined_.clear();
  pulled_ = 0;
  checkpoints_.Reset();
  if (status.phase() == v1::ROUND_PHASE_EVALUATING) return;  // the last version is out
  buffer_open_ = false;
  model_.Forget();
  status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
}

v1::CoordinatorEvent FederatedAsyncTask::TrainEvent(const v1::TaskStatus& status) const {
  v1::CoordinatorEvent event;
  event.mutable_train_async()->set_model_version(status.model_version());
  event.mutable_train_async()->set_round_batches(spec_.round_batches());
  return event;
}

void FederatedAsyncTask::Advance(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  if (status.phase() == v1::ROUND_PHASE_EVALUATING) {
    bool done = false;
    for (int i = status.history_size() - 1; i >= 0 && !done; --i) {
      if (status.history(i).model_version() == status.model_version()) {
        done = status.history(i).evaluation_complete();
        break;
      }
    }
    if (done || now >= eval_deadline_) {
      fx.Finish(v1::TASK_STATE_COMPLETED,
                absl::StrCat("published ", status.model_version(), " versions"));
    }
    return;
  }
  if (!has_aggregator_ || opening_ || !retry_.Ready(now)) return;
  if (buffer_open_) {
    if (reopen_) {
      reopen_ = false;
      AskOpen(status, fx);
    }
    return;
  }
  if (model_.Next(peers_, now, status, fx) != GlobalModel::Step::kHeld) return;
  if (status.model_version() >= spec_.rounds()) {
    // Resumed after the last version (the coordinator before this one stopped while the peers
    // evaluated it): a buffer would wait for a version past the last; the evaluation ends it.
    status.set_state(v1::TASK_STATE_RUNNING);
    EvaluateLast(now, status, fx);
    Advance(now, status, fx);
    return;
  }
  if (peers_.size() < spec_.min_participants()) {
    if (waiting_.Update(peers_, spec_.min_participants(), now, status, fx)) {
      status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    }
    return;
  }
  waiting_.Clear();
  AskOpen(status, fx);
  status.set_phase(v1::ROUND_PHASE_OPENING);
  fx.changed = true;
}

void FederatedAsyncTask::AskOpen(const v1::TaskStatus& status, ModeEffects& fx) {
  AggregatorWork open;
  open.kind = Kind::kOpenBuffer;
  open.peers.assign(peers_.begin(), peers_.end());
  open.buffer.set_base_version(status.model_version());
  *open.buffer.mutable_async() = spec_.async();
  aggregation::ApplyAsyncDefaults(*open.buffer.mutable_async(), spec_.min_participants());
  open.buffer.mutable_aggregation()->set_strategy(spec_.aggregation());
  *open.buffer.mutable_aggregation()->mutable_options() = spec_.aggregation_options();
  open.buffer.set_max_update_norm(spec_.max_update_norm());
  open.buffer.set_last_version(spec_.rounds());
  opening_ = true;
  fx.Ask(std::move(open));
}

void FederatedAsyncTask::OnWorkDone(const WorkResult& result, absl::Time now,
                                    v1::TaskStatus& status, ModeEffects& fx) {
  switch (result.work.kind) {
    case Kind::kRestore:
      fx.changed = true;
      if (absl::Status s = model_.OnRestored(result, status, fx); !s.ok()) {
        retry_.Failed("restore checkpoint", s, now, status, fx);
      } else {
        retry_.Succeeded();
        status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
      }
      break;
    case Kind::kOpenBuffer:
      if (!opening_) return;  // reset meanwhile
      opening_ = false;
      OnBufferOpened(result, now, status, fx);
      break;
    case Kind::kPullTree:
      // Every node of the tree fetched the version (or logged why not): its peers may now.
      if (result.work.version > pulled_ && result.work.version <= status.model_version()) {
        pulled_ = result.work.version;
        Publish(pulled_, fx);
      }
      return;
    case Kind::kCheckpoint:  // the core logged and counted a failure
      checkpoints_.Done(fx);
      return;
    default:
      return;
  }
  Advance(now, status, fx);
}

void FederatedAsyncTask::OnBufferOpened(const WorkResult& result, absl::Time now,
                                        v1::TaskStatus& status, ModeEffects& fx) {
  fx.changed = true;
  const bool reopened = buffer_open_;
  if (!result.status.ok()) {
    if (reopened) {
      reopen_ = true;  // the buffers are still open: Advance tries again
      retry_.Failed("open the tree's buffers again", result.status, now, status, fx);
      return;
    }
    status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
    if (absl::IsNotFound(result.status) || absl::IsFailedPrecondition(result.status)) {
      model_.Forget();  // the aggregator lost the task or holds another version: restore
    } else if (absl::IsResourceExhausted(result.status)) {
      fx.Finish(v1::TASK_STATE_FAILED,
                absl::StrCat("open buffer refused: ", result.status.message()));
      return;
    }
    retry_.Failed("open buffer", result.status, now, status, fx);
    return;
  }
  retry_.Succeeded();
  const v1::CoordinatorEvent event = TrainEvent(status);
  if (!tree_) {
    for (const std::string& id : peers_) fx.Send(id, event);
  } else {
    // Those the buffers were opened for train; one that came since waits for the next opening,
    // and one that trains already is not told again.
    for (const std::string& id : result.work.peers) {
      if (peers_.count(id) == 0 || (reopened && joined_.count(id) == 0)) continue;
      joined_.erase(id);
      fx.Send(id, event);
    }
    if (!joined_.empty()) reopen_ = true;
  }
  if (reopened) return;
  buffer_open_ = true;
  last_version_at_ = now;
  status.set_state(v1::TASK_STATE_RUNNING);
  status.set_phase(v1::ROUND_PHASE_BUFFERING);
  status.set_message(absl::StrCat("version ", status.model_version(), " of ", spec_.rounds(), "; ",
                                  peers_.size(), " peers train and push"));
}

void FederatedAsyncTask::OnAggregatorEvent(const aggregator::v1::TaskEvent& event, absl::Time now,
                                           v1::TaskStatus& status, ModeEffects& fx) {
  if (!buffer_open_ || !event.has_version_published()) return;
  OnVersion(event.version_published(), now, status, fx);
}

void FederatedAsyncTask::OnVersion(const aggregator::v1::VersionPublished& v, absl::Time now,
                                   v1::TaskStatus& status, ModeEffects& fx) {
  if (v.version() <= status.model_version()) return;  // seen before (a re-delivered event)
  v1::RoundSummary summary;
  summary.set_round(v.version());
  for (const std::string& id : v.contributors()) {
    summary.add_participants(id);
    ++contributions_[id];
  }
  summary.set_mean_train_loss(v.mean_train_loss());
  summary.set_num_samples(v.num_samples());
  summary.set_model_version(v.version());
  summary.set_model_digest(v.digest_xxh3());
  summary.set_duration_ms(absl::ToInt64Milliseconds(now - last_version_at_));
  summary.set_completed_unix_ms(absl::ToUnixMillis(now));
  summary.set_mean_staleness(v.mean_staleness());
  summary.set_note(v.note());
  if (peers_.empty()) summary.set_evaluation_complete(true);  // published to nobody
  fx.rounds_completed.push_back(summary);
  last_version_at_ = now;
  status.set_model_version(v.version());
  status.set_round(v.version());
  PublishPeers(status);
  checkpoints_.Published(v.version(), v.version(), fx);
  if (tree_) {
    // Its peers fetch it at their clusters' aggregators: those fetch it first.
    AggregatorWork pull;
    pull.kind = Kind::kPullTree;
    pull.version = v.version();
    fx.Ask(std::move(pull));
  } else {
    Publish(v.version(), fx);
  }
  if (v.version() >= spec_.rounds()) {
    buffer_open_ = false;  // the aggregator closed it after the last version
    EvaluateLast(now, status, fx);
  } else {
    status.set_message(absl::StrCat("version ", v.version(), " of ", spec_.rounds(), "; ",
                                    peers_.size(), " peers train and push"));
  }
  fx.changed = true;
}

void FederatedAsyncTask::EvaluateLast(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
  status.set_phase(v1::ROUND_PHASE_EVALUATING);
  eval_deadline_ =
      now + std::min(options_.final_eval_timeout, absl::Seconds(spec_.round_deadline_seconds()));
  status.set_message("evaluating the final model");
  fx.changed = true;
}

void FederatedAsyncTask::Publish(uint64_t version, ModeEffects& fx) const {
  v1::CoordinatorEvent published;
  published.mutable_model_published()->set_round(version);
  published.mutable_model_published()->set_version(version);
  for (const std::string& id : peers_) fx.Send(id, published);
}

void FederatedAsyncTask::PublishPeers(v1::TaskStatus& status) const {
  status.clear_peers();
  for (const auto& [id, updates] : contributions_) {
    v1::PeerProgress& p = *status.add_peers();
    p.set_peer_id(id);
    p.set_state(peers_.count(id) ? "training" : "left");
    p.set_updates(updates);
  }
}

std::unique_ptr<ModeTask> MakeFederatedAsyncTask(const v1::TaskStatus& status,
                                                 const ModeOptions& options,
                                                 CoordinatorMetrics& metrics) {
  return std::make_unique<FederatedAsyncTask>(status, options, metrics);
}

}  // namespace shoal::coordinator
