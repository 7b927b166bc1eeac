// CoordinatorCore: what every task has whatever its mode: evaluation bookkeeping, status and
// store updates, the effects of its mode, leaving and finishing.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/task/task_federated.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/hello_check.h"
#include "services/coordinator/peer_data.h"
#include "services/coordinator/round_lists.h"
#include "services/coordinator/task_names.h"

namespace shoal::coordinator {

bool CoordinatorCore::IsActive(const Task& task) const {
  return task.status.state() == v1::TASK_STATE_WAITING ||
         task.status.state() == v1::TASK_STATE_RUNNING;
}

void CoordinatorCore::EndWatches(const std::string& name, const absl::Status& why, Outbox& out) {
  for (auto w = watchers_.begin(); w != watchers_.end();) {
    if (w->second.task != name) {
      ++w;
      continue;
    }
    if (w->second.ended) out.push_back([ended = w->second.ended, why] { ended(why); });
    w = watchers_.erase(w);
  }
}

void CoordinatorCore::ExpectEvaluation(Task& task, const std::string& peer_id, uint64_t version) {
  if (peers_.count(peer_id)) task.evaluating[version].insert(peer_id);
}

void CoordinatorCore::EvaluationDone(Task& task, const std::string& peer_id,
                                     std::optional<uint64_t> up_to) {
  std::vector<uint64_t> complete;
  for (auto& [v, pending] : task.evaluating) {
    if (up_to.has_value() && v > *up_to) break;
    if (pending.erase(peer_id) && pending.empty()) complete.push_back(v);
  }
  for (uint64_t v : complete) CompleteEvaluation(task, v);
}

void CoordinatorCore::CompleteEvaluation(Task& task, uint64_t version) {
  task.evaluating.erase(version);
  auto* history = task.status.mutable_history();
  for (int i = history->size() - 1; i >= 0; --i) {
    v1::RoundSummary& r = (*history)[i];
    if (r.model_version() != version) continue;
    if (r.evaluation_complete()) return;
    r.set_evaluation_complete(true);
    task.unsaved_rounds.erase(r.round());
    StoreRound(task.status.spec().name(), r);
    return;  // the caller marks the task changed
  }
}

absl::Status CoordinatorCore::CreditEvalReport(Task& task, const std::string& peer_id,
                                               const v1::EvalReport& report) {
  if (report.total() == 0 || report.correct() > report.total()) {
    return absl::InvalidArgumentError("eval report with total 0 or correct > total");
  }
  // Credit the newest round that produced this version.
  auto* history = task.status.mutable_history();
  for (int i = history->size() - 1; i >= 0; --i) {
    v1::RoundSummary& r = (*history)[i];
    if (r.model_version() != report.version()) continue;
    const uint64_t samples = r.test_samples() + report.total();
    const double correct = r.test_accuracy() * r.test_samples() + report.correct();
    const double loss = r.test_loss() * r.test_samples() + report.loss_sum();
    r.set_test_samples(samples);
    r.set_test_accuracy(correct / samples);
    r.set_test_loss(loss / samples);
    r.set_evaluated(true);
    metrics_.test_accuracy.Set(r.test_accuracy());
    task.unsaved_rounds.insert(r.round());  // stored by the next Step()
    break;
  }
  EvaluationDone(task, peer_id, report.version());
  return absl::OkStatus();
}

void CoordinatorCore::SendTo(const std::string& peer_id, v1::CoordinatorEvent event, Outbox& out) {
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return;
  out.push_back([this, sink = it->second.sink, event = std::move(event)] {
    if (!fenced_) sink->Send(event);  // else another coordinator has the peer's task now
  });
}

void CoordinatorCore::CheckStoreWrite(const absl::Status& written, const std::string& task,
                                      const char* what) {
  if (written.ok()) return;
  LogError("task ", task, ": cannot persist ", what, ": ", written.message());
  if (absl::IsFailedPrecondition(written) && !fenced_.exchange(true)) {
    LogError(
        "the store refused a write: this coordinator no longer holds its tasks; it sends "
        "peers and aggregators nothing more");
  }
}

v1::CoordinatorEvent CoordinatorCore::TaskAssignedEvent(const Task& task,
                                                        const std::string& peer_id) const {
  v1::CoordinatorEvent event;
  event.set_task(task.status.spec().name());
  *event.mutable_task_assigned()->mutable_spec() = task.status.spec();
  event.mutable_task_assigned()->mutable_spec()->clear_join_token();
  event.mutable_task_assigned()->set_aggregator_address(AggregatorOf(task, peer_id));
  event.mutable_task_assigned()->set_created_unix_ms(task.status.created_unix_ms());
  if (task.status.has_statistics()) {
    *event.mutable_task_assigned()->mutable_statistics() = task.status.statistics();
  }
  return event;
}

v1::TaskStatus CoordinatorCore::StatusOf(const Task& task) const {
  // The history is copied with its per-peer lists bounded (round_lists.h), so it is swapped out
  // while the rest is copied: the lock is held exclusively, so no one sees the task without it.
  v1::TaskStatus status;
  {
    auto& history =
        const_cast<google::protobuf::RepeatedPtrField<v1::RoundSummary>&>(task.status.history());
    google::protobuf::RepeatedPtrField<v1::RoundSummary> held;
    held.Swap(&history);
    status = task.status;
    held.Swap(&history);
  }
  AppendRounds(task.status.history(), kRoundListBudget, status.mutable_history());
  status.mutable_spec()->clear_join_token();  // a secret: never leaves the coordinator
  for (const std::string& id : task.peers) {
    status.add_participants(id);
    if (auto peer = peers_.find(id); peer != peers_.end()) {
      *status.add_nodes() = PeerNode(peer->second);
    }
  }
  if (task.links.empty()) {
    if (const AggregatorPool::Entry* entry = pool_.Find(task.status.aggregator()); entry) {
      *status.add_nodes() = AggregatorNode(task.status.aggregator(), *entry);
    }
  }
  for (const Task::Link& link : task.links) {
    if (const AggregatorPool::Entry* entry = pool_.Find(link.address); entry) {
      *status.add_nodes() = AggregatorNode(link.address, *entry);
    }
  }
  ShowClusters(task, status);
  return status;
}

void CoordinatorCore::NotifyWatchers(const Task& task, Outbox& out) {
  // Built only when someone watches, and shared by all of them: a status carries the whole
  // history, which with many peers is large.
  std::shared_ptr<const v1::TaskStatus> status;
  for (const auto& [handle, watcher] : watchers_) {
    if (watcher.task != task.status.spec().name()) continue;
    if (status == nullptr) status = std::make_shared<const v1::TaskStatus>(StatusOf(task));
    out.push_back([cb = watcher.callback, status] { cb(*status); });
  }
}

void CoordinatorCore::MarkChanged(Task& task, Outbox& out) {
  task.membership_dirty = false;
  NotifyWatchers(task, out);
  // The store keeps the whole spec, join token included (StatusOf strips it), but not the
  // history (rounds are stored one by one): copy the status without it, which would make every
  // change cost O(rounds x peers).
  google::protobuf::RepeatedPtrField<v1::RoundSummary> history;
  history.Swap(task.status.mutable_history());
  auto stored = std::make_shared<const v1::TaskStatus>(task.status);
  history.Swap(task.status.mutable_history());
  // Queued in order on the store's queue after the lock is released (Flush keeps the order).
  out.push_back([this, stored] {
    store_writes_.Post([this, stored] {
      CheckStoreWrite(store_.PutTask(*stored), stored->spec().name(), "its status");
    });
  });
}

void CoordinatorCore::StoreRound(const std::string& task, const v1::RoundSummary& round) {
  // Called under the lock: a store write among the effects (Flush), so what is queued after it,
  // the events that publish the round's version among them, happens only once it is stored. No
  // peer then holds a version whose round a restarted coordinator does not know (its restore
  // looks for the version published last: AggregatorWork::kRestore).
  effects_.emplace_back(
      [this, task, round] { CheckStoreWrite(store_.PutRound(task, round), task, "a round"); },
      /*stored=*/true);
}

void CoordinatorCore::SaveRounds(Task& task) {
  if (task.unsaved_rounds.empty()) return;
  for (const v1::RoundSummary& r : task.status.history()) {
    if (task.unsaved_rounds.count(r.round())) StoreRound(task.status.spec().name(), r);
  }
  task.unsaved_rounds.clear();
}

void CoordinatorCore::ApplyModeEffects(Task& task, ModeEffects& fx, Outbox& out) {
  const std::string& name = task.status.spec().name();
  // Until the aggregators have confirmed the current members, events wait (Task::held).
  const std::vector<uint64_t> needed = task.MembersNeeded();
  const bool hold = task.UsesAggregator() && (!task.MembersConfirmed(needed) || !task.held.empty());
  for (auto& [id, event] : fx.events) {
    event.set_task(name);
    if (event.has_initialize_model() &&
        task.status.spec().topology() == common::v1::TOPOLOGY_HIERARCHICAL) {
      // The root holds the task's models; the clusters' aggregators fetch them from it.
      event.mutable_initialize_model()->set_aggregator_address(task.status.aggregator());
    }
    if (event.has_round_started() && task::ReplicasOf(task.status.spec()) > 1) {
      // Replicas: the peer's cluster's aggregators, for it to go on to a backup.
      if (auto c = task.cluster_of.find(id);
          c != task.cluster_of.end() && c->second > 0 && c->second < task.links.size()) {
        const Task::Link& link = task.links[c->second];
        event.mutable_round_started()->add_aggregators(link.address);
        for (const std::string& backup : link.backups) {
          event.mutable_round_started()->add_aggregators(backup);
        }
      }
    }
    if (event.has_model_published()) {
      ExpectEvaluation(task, id, event.model_published().version());
    }
    if (hold) {
      task.held.push_back({id, std::move(event), needed});
    } else {
      SendTo(id, std::move(event), out);
    }
  }
  if (fx.rounds_rerun_after.has_value()) {
    const uint64_t after = *fx.rounds_rerun_after;
    for (auto it = task.unsaved_rounds.begin(); it != task.unsaved_rounds.end();) {
      it = *it > after ? task.unsaved_rounds.erase(it) : std::next(it);
    }
    effects_.emplace_back(
        [this, name, after] {
          CheckStoreWrite(store_.DeleteRoundsAfter(name, after), name, "the rounds to run again");
        },
        /*stored=*/true);
  }
  if (!fx.rounds_completed.empty()) task.errored.clear();  // progress: errors were passing
  for (v1::RoundSummary& summary : fx.rounds_completed) {
    if (summary.completed_unix_ms() == 0)
      summary.set_completed_unix_ms(absl::ToUnixMillis(clock_.Now()));
    *task.status.add_history() = summary;
    metrics_.rounds_completed.Increment();
    metrics_.round_duration.Observe(static_cast<double>(summary.duration_ms()) / 1000.0);
    metrics_.peers_dropped.Increment(static_cast<double>(summary.dropped_size()));
    if (summary.participants_size() > 0) metrics_.train_loss.Set(summary.mean_train_loss());
    StoreRound(name, summary);
  }
  TrimHistory(task);
  if (!fx.work.empty()) PostWork(task, std::move(fx.work), out);
  if (fx.finish.has_value()) {
    Finish(task, fx.finish->first, fx.finish->second, out);  // marks the task changed
    return;
  }
  if (fx.changed || !fx.rounds_completed.empty()) MarkChanged(task, out);
}

void CoordinatorCore::TrimHistory(Task& task) {
  auto* history = task.status.mutable_history();
  const int excess = history->size() - static_cast<int>(options_.history_in_memory);
  if (excess <= 0) return;
  // Every round is stored when it completes; what EvalReports added since is stored now, before
  // the summary leaves memory.
  for (int i = 0; i < excess; ++i) {
    const v1::RoundSummary& r = (*history)[i];
    if (task.unsaved_rounds.erase(r.round())) StoreRound(task.status.spec().name(), r);
  }
  history->DeleteSubrange(0, excess);
}

void CoordinatorCore::PeerFailed(Task& task, const std::string& peer_id, const std::string& message,
                                 Outbox& out) {
  Task::Errored& e = task.errored[peer_id];
  ++e.count;
  e.message = message;
  e.retry_at =
      clock_.Now() + std::min(absl::Minutes(1), absl::Seconds(1) * (1 << std::min(e.count - 1, 6)));
  LeaveTask(task, peer_id, absl::StrCat("error: ", message), out);
  const size_t need = std::max<size_t>(1, task.status.spec().min_participants());
  if (IsActive(task) && task.peers.empty() && task.errored.size() >= need) {
    Finish(task, v1::TASK_STATE_FAILED,
           absl::StrCat("every peer failed in this task (", task.errored.size(),
                        " peers; the last: ", message, ")"),
           out);
  }
}

void CoordinatorCore::LeaveTask(Task& task, const std::string& peer_id, const std::string& why,
                                Outbox& out) {
  task.peers.erase(peer_id);
  task.moments.erase(peer_id);  // the statistics add up the present peers' moments
  if (task.secure_moments != nullptr) {
    SecureStatistics::Effects fx;
    task.secure_moments->Left(peer_id, fx);
    SendSecureSteps(task, fx, out);
  }
  MembersChanged(task, peer_id);
  UnplacePeer(task, peer_id);
  if (IsActive(task)) ForgetPeerData(task.status, peer_id);  // the last participants stay
  EvaluationDone(task, peer_id);
  if (task.mode != nullptr && IsActive(task)) {
    ModeEffects fx;
    task.mode->RemovePeer(peer_id, why, clock_.Now(), task.status, fx);
    ApplyModeEffects(task, fx, out);
  }
  MarkMembershipChanged(task);
}

void CoordinatorCore::Finish(Task& task, v1::TaskState state, const std::string& message,
                             Outbox& out) {
  const std::string& name = task.status.spec().name();
  task.status.set_state(state);
  task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
  task.status.set_message(message);
  task.status.set_ended_unix_ms(absl::ToUnixMillis(clock_.Now()));
  LogInfo("task ", name, " ", StateName(state), ": ", message);
  v1::CoordinatorEvent event;
  event.set_task(name);
  event.mutable_task_finished()->set_state(StateName(state));
  event.mutable_task_finished()->set_final_version(task.status.model_version());
  for (const std::string& id : task.peers) {
    SendTo(id, event, out);
    auto p = peers_.find(id);
    if (p != peers_.end()) {
      p->second.task.clear();
      idle_peers_.insert(id);
    }
  }
  task.peers.clear();
  while (!task.evaluating.empty()) CompleteEvaluation(task, task.evaluating.begin()->first);
  // Nothing of the task runs at its aggregators any more (primaries, backups, and those of an
  // earlier tree): stop watching, free it there (fire and forget: it does not block the task),
  // drop late results.
  NewEpoch(task);
  DropLinks(task);
  ReleaseFormerHolders(task, out);
  MarkChanged(task, out);
}

// --- Restored and shared tasks -----------------------------------------------------------

void CoordinatorCore::RestoreTask(StoredTask stored, const std::string& message) {
  const std::string name = stored.status.spec().name();
  Task& task = tasks_[name];
  task.status = std::move(stored.status);
  for (auto& round : stored.history) *task.status.add_history() = std::move(round);
  task_order_.push_back(name);
  deleted_.erase(name);
  if (!IsActive(task)) {
    // Ended before coordinators kept the time: --keep-ended-tasks counts from now.
    if (task.status.ended_unix_ms() == 0) {
      task.status.set_ended_unix_ms(absl::ToUnixMillis(clock_.Now()));
    }
    return;
  }
  // A fresh state machine from the stored status: the peers come back and tell it what they
  // hold, and an aggregator-backed mode restores its newest checkpoint on an aggregator.
  task.status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
  task.status.set_state(v1::TASK_STATE_WAITING);
  task.holder_before_restart = task.status.aggregator();
  task.status.clear_aggregator();
  task.mode = MakeModeTask(task.status, options_.mode, metrics_);
  task.status.clear_peers();
  if (task.mode == nullptr) {
    task.status.set_state(v1::TASK_STATE_FAILED);
    task.status.set_message(absl::StrCat("mode ", ModeName(task.status.spec().mode()),
                                         " is not supported by this coordinator"));
    LogWarning("task ", name, ": ", task.status.message());
    return;
  }
  task.waiting_for_aggregator_since = clock_.Now();
  task.status.set_message(message);
  LogInfo("task ", name, ": ", message,
          task.status.round() > 0 ? absl::StrCat(" (after round ", task.status.round(), ")") : "");
}

absl::Status CoordinatorCore::AdoptTask(const std::string& name) {
  SHOAL_ASSIGN_OR_RETURN(StoredTask stored, store_.LoadTask(name, options_.history_in_memory));
  Outbox out;
  {
    InputLock lock(*this, out);
    if (stopping_ || tasks_.count(name) > 0) return absl::OkStatus();
    // A task stored for this coordinator when it was created has never run anywhere.
    const bool fresh = stored.status.round() == 0 && stored.history.empty();
    RestoreTask(std::move(stored),
                fresh ? "waiting for peers" : "taken over from another coordinator");
    Task& task = tasks_[name];
    if (IsActive(task)) MarkChanged(task, out);
    Reconcile(out);
  }
  Flush();
  return absl::OkStatus();
}

absl::Status CoordinatorCore::HandOffTask(const std::string& name) {
  if (placement_ == nullptr) {
    return absl::FailedPreconditionError("this coordinator does not share its tasks");
  }
  Outbox out;
  {
    InputLock lock(*this, out);
    if (stopping_ || fenced_) {
      return absl::FailedPreconditionError("this coordinator is stopping or lost its hold");
    }
    auto it = tasks_.find(name);
    if (it == tasks_.end()) return absl::NotFoundError(absl::StrCat("no task named ", name));
    Task& task = it->second;
    if (!IsActive(task)) {
      return absl::FailedPreconditionError(absl::StrCat("task ", name, " is not open"));
    }
    LogInfo("task ", name, ": no longer served here; its ", task.peers.size(),
            " peers and its watches go to its next coordinator");
    // What is not stored yet goes first (the effects below run in order behind it).
    SaveRounds(task);
    task.status.set_message("handed over to another coordinator");
    MarkChanged(task, out);
    const absl::Status moved = absl::UnavailableError(absl::StrCat(
        "task \"", name, "\" is moving to another coordinator; ask again in a moment"));
    const absl::Time now = clock_.Now();
    for (auto p = handed_off_peers_.begin(); p != handed_off_peers_.end();) {
      p = now - p->second.second >= kFollowHandOff ? handed_off_peers_.erase(p) : std::next(p);
    }
    for (const std::string& id : task.peers) {
      handed_off_peers_[id] = {name, now};
      auto peer = peers_.find(id);
      if (peer == peers_.end()) continue;
      out.push_back([sink = peer->second.sink, moved] { sink->Close(moved); });
      peers_.erase(peer);
      idle_peers_.erase(id);
      SupernodeHostLeft(id);
    }
    metrics_.peers_connected.Set(static_cast<double>(peers_.size()));
    EndWatches(name, moved, out);
    // Results of the task's aggregator work still running are dropped with the task; the new
    // owner finds the aggregators as a coordinator that took the task over after a failure.
    NewEpoch(task);
    DropLinks(task);
    tasks_.erase(it);
    task_order_.erase(std::find(task_order_.begin(), task_order_.end(), name));
    // Behind the task's aggregator calls, and then behind every store write decided so far
    // (those about the task included): only then may another coordinator write about it.
    out.push_back([this, name] {
      work_.AfterTask(name, [this, name] {
        store_writes_.Post([this, name] {
          {
            // Unless the task came back meanwhile (its work then goes on in the same queues).
            absl::MutexLock lock(&mu_);
            if (tasks_.count(name) == 0) work_.DropTask(name);
          }
          if (absl::Status released = placement_->Release(name); !released.ok()) {
            LogError("task ", name,
                     ": cannot release it for another coordinator: ", released.ToString(),
                     " (it moves when this coordinator's lease ends)");
          }
        });
      });
    });
    Reconcile(out);
  }
  Flush();
  return absl::OkStatus();
}

absl::Status CoordinatorCore::Routed(absl::Status status, const std::string& name) const {
  if (placement_ == nullptr || !absl::IsNotFound(status)) return status;
  {
    absl::MutexLock lock(&mu_);
    if (tasks_.count(name) > 0) return status;  // NOT_FOUND about something else of the task
  }
  return placement_->Elsewhere(name);
}

std::optional<std::string> CoordinatorCore::ElsewhereFor(const std::string& join_token) const {
  bool admitted = false;
  for (const auto& [name, task] : tasks_) {
    if (!IsActive(task) || !TokenAdmits(task.status.spec(), join_token)) continue;
    if (task.status.state() == v1::TASK_STATE_WAITING) return std::nullopt;  // needed here
    admitted = true;
  }
  if (std::optional<std::string> waiting = placement_->OpenTaskFor(join_token, true)) {
    return waiting;
  }
  if (admitted) return std::nullopt;
  return placement_->OpenTaskFor(join_token, false);
}

void CoordinatorCore::SendIdlePeersElsewhere(Outbox& out) {
  for (const std::string& id : idle_peers_) {
    const Peer& peer = peers_.at(id);
    std::optional<std::string> there = ElsewhereFor(peer.hello.join_token());
    if (!there.has_value()) continue;
    LogInfo("peer ", id, ": no task here needs it; sent to coordinator ", *there);
    out.push_back([sink = peer.sink, there = *there] {
      sink->Close(absl::UnavailableError(
          absl::StrCat("no task of this coordinator needs this peer; an open task is at "
                       "coordinator ",
                       there)));
    });
  }
}

}  // namespace shoal::coordinator
