// CoordinatorCore: the aggregators of the tasks whose mode uses one. Which aggregator a task
// uses, keeping it told of the members, watching it, moving the task when it is lost, and the
// mode's aggregator work.

#include <algorithm>
#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"
#include "libs/common/log.h"
#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator {

absl::Status CoordinatorCore::RegisterAggregator(const std::string& address,
                                                 const common::v1::Capacity& capacity) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: expected HOST:PORT, got \"", address, "\""));
  }
  Outbox out;
  {
    InputLock lock(*this, out);
    if (pool_.Register(address, capacity, clock_.Now())) {
      LogInfo("aggregator ", address, " registered (",
              capacity::Describe(pool_.Find(address)->capacity), ")");
      DialBack(/*aggregator=*/true, address, address, nullptr, out);
    }
    metrics_.aggregators_registered.Set(static_cast<double>(pool_.size()));
    Reconcile(out);
  }
  Flush();
  return absl::OkStatus();
}

void CoordinatorCore::ReconcileAggregators(Outbox& out) {
  const absl::Time now = clock_.Now();
  for (const std::string& address : pool_.Expire(now)) {
    LoseAggregator(address, "it stopped registering", out);
  }
  metrics_.aggregators_registered.Set(static_cast<double>(pool_.size()));
  std::map<std::string, size_t> load;
  for (const auto& [name, task] : tasks_) {
    if (IsActive(task) && !task.status.aggregator().empty()) ++load[task.status.aggregator()];
  }
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task) || task.mode == nullptr || !task.mode->UsesAggregator()) continue;
    if (task.status.aggregator().empty()) {
      const std::string address = pool_.Pick(load);
      if (!address.empty()) {
        ++load[address];
        AssignAggregator(task, address, out);
      } else if (task.waiting_for_aggregator_since.has_value() &&
                 now - *task.waiting_for_aggregator_since > options_.aggregator_wait) {
        Finish(task, v1::TASK_STATE_FAILED,
               absl::StrCat("no aggregator registered within ",
                            absl::FormatDuration(options_.aggregator_wait)),
               out);
        continue;
      } else if (task.status.message() != "waiting for an aggregator to register") {
        task.status.set_message("waiting for an aggregator to register");
        MarkChanged(task, out);
      }
    }
  }
}

void CoordinatorCore::SendDirtyMembers(Outbox& out) {
  const absl::Time now = clock_.Now();
  for (auto& [name, task] : tasks_) {
    // One call at a time: the changes made while it is in flight go in the next one (its
    // answer sends it), so N joins cost a few calls of the whole membership instead of N.
    if (IsActive(task) && !task.status.aggregator().empty() && task.members_dirty &&
        task.members_in_flight == 0 && now >= task.members_retry_at) {
      SendMembers(task, out);
    }
  }
}

void CoordinatorCore::AssignAggregator(Task& task, const std::string& address, Outbox& out) {
  const std::string& name = task.status.spec().name();
  const bool moved = task.waiting_for_aggregator_since.has_value() && !task.peers.empty();
  task.status.set_aggregator(address);
  task.waiting_for_aggregator_since.reset();
  NewEpoch(task);
  task.members_dirty = true;
  task.members_retry_at = absl::InfinitePast();
  LogInfo("task ", name, " uses aggregator ", address);
  StartWatch(task, out);
  // Peers assigned before learn the new address (the same spec: they keep their state).
  if (moved) {
    for (const std::string& id : task.peers) SendTo(id, TaskAssignedEvent(task), out);
  }
  SendMembers(task, out);  // before anything the mode asks of the new aggregator
  ModeEffects fx;
  task.mode->OnAggregator(address, clock_.Now(), task.status, fx);
  fx.changed = true;
  ApplyModeEffects(task, fx, out);
}

void CoordinatorCore::LoseAggregator(const std::string& address, const std::string& why,
                                     Outbox& out) {
  if (pool_.Has(address)) pool_.Remove(address);
  bool any = false;
  const absl::Time now = clock_.Now();
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task) || task.status.aggregator() != address) continue;
    if (!any) LogWarning("aggregator ", address, " is lost: ", why);
    any = true;
    NewEpoch(task);
    RetireWatch(task);
    task.status.clear_aggregator();
    task.waiting_for_aggregator_since = now;
    metrics_.aggregator_errors.Increment();
    ModeEffects fx;
    task.mode->OnAggregatorLost(now, task.status, fx);
    fx.changed = true;
    ApplyModeEffects(task, fx, out);
  }
}

void CoordinatorCore::NewEpoch(Task& task) {
  ++task.epoch;
  task.members_in_flight = 0;
  task.members_acked = task.members_sent;  // the older epoch's calls are ignored
  task.held.clear();
}

void CoordinatorCore::SendMembers(Task& task, Outbox& out) {
  task.members_dirty = false;
  ++task.members_in_flight;
  const uint64_t version = ++task.members_sent;
  aggregator::v1::SetMembersRequest request;
  for (const std::string& id : task.peers) {
    auto peer = peers_.find(id);
    if (peer != peers_.end()) (*request.mutable_session_tokens())[id] = peer->second.session_token;
  }
  out.push_back([this, name = task.status.spec().name(), address = task.status.aggregator(),
                 epoch = task.epoch, version, request = std::move(request)]() mutable {
    work_.SetMembers(
        name, address, std::move(request),
        [this, name, epoch, version](absl::Status s) { OnMembersSet(name, epoch, version, s); });
  });
}

void CoordinatorCore::PostWork(Task& task, std::vector<AggregatorWork> work, Outbox& out) {
  if (task.status.aggregator().empty()) return;  // lost meanwhile: the mode starts over later
  // The aggregator learns who may push before anything else happens for the task.
  if (task.members_dirty) SendMembers(task, out);
  for (AggregatorWork& w : work) {
    w.id = next_work_++;
    out.push_back([this, name = task.status.spec().name(), address = task.status.aggregator(),
                   epoch = task.epoch, w = std::move(w)]() mutable {
      work_.Run(name, address, std::move(w),
                [this, name, epoch](WorkResult r) { OnWorkDone(name, epoch, r); });
    });
  }
}

void CoordinatorCore::StartWatch(Task& task, Outbox& out) {
  RetireWatch(task);
  // Started after the lock is released: the client may deliver the first event inline.
  out.push_back([this, name = task.status.spec().name(), address = task.status.aggregator(),
                 epoch = task.epoch] {
    std::unique_ptr<aggregator::AggregatorWatch> watch = aggregators_.WatchTask(
        address, name,
        [this, name, epoch](const aggregator::v1::TaskEvent& e) {
          OnAggregatorEvent(name, epoch, e);
        },
        [this, name, epoch](const absl::Status& s) { OnWatchDone(name, epoch, s); });
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(name);
    if (it != tasks_.end() && it->second.epoch == epoch && !stopping_) {
      it->second.watch = std::move(watch);
    } else {
      retired_watches_.push_back(std::move(watch));  // the task moved on meanwhile
    }
  });
}

void CoordinatorCore::RetireWatch(Task& task) {
  if (task.watch != nullptr) retired_watches_.push_back(std::move(task.watch));
}

void CoordinatorCore::OnWorkDone(const std::string& name, uint64_t epoch,
                                 const WorkResult& result) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end() || it->second.epoch != epoch || !IsActive(it->second)) return;
    Task& task = it->second;
    // A restore may have reset the task at the aggregator: tell it the members again.
    if (result.work.kind == AggregatorWork::Kind::kRestore) task.members_dirty = true;
    ModeEffects fx;
    task.mode->OnWorkDone(result, clock_.Now(), task.status, fx);
    ApplyModeEffects(task, fx, out);
    Reconcile(out);
  }
  Flush();
}

void CoordinatorCore::OnMembersSet(const std::string& name, uint64_t epoch, uint64_t members,
                                   const absl::Status& status) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end() || it->second.epoch != epoch) return;
    Task& task = it->second;
    --task.members_in_flight;
    if (!status.ok()) {
      LogWarning("task ", name, ": set members: ", status.message(), " (retrying)");
      metrics_.aggregator_errors.Increment();
      task.members_dirty = true;
      task.members_retry_at = clock_.Now() + options_.mode.retry_initial;
      return;  // the held events wait for a SetMembers that succeeds
    }
    task.members_acked = std::max(task.members_acked, members);
    // The events whose membership is confirmed go out, in order; the rest keep waiting.
    size_t released = 0;
    while (released < task.held.size() && task.held[released].members <= task.members_acked) {
      SendTo(task.held[released].peer, std::move(task.held[released].event), out);
      ++released;
    }
    task.held.erase(task.held.begin(), task.held.begin() + static_cast<ptrdiff_t>(released));
    if (task.members_dirty && task.members_in_flight == 0) SendMembers(task, out);
  }
  Flush();
}

void CoordinatorCore::OnAggregatorEvent(const std::string& name, uint64_t epoch,
                                        const aggregator::v1::TaskEvent& event) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end() || it->second.epoch != epoch || !IsActive(it->second)) return;
    Task& task = it->second;
    ModeEffects fx;
    task.mode->OnAggregatorEvent(event, clock_.Now(), task.status, fx);
    ApplyModeEffects(task, fx, out);
    Reconcile(out);
  }
  Flush();
}

void CoordinatorCore::OnWatchDone(const std::string& name, uint64_t epoch,
                                  const absl::Status& status) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (stopping_ || it == tasks_.end() || it->second.epoch != epoch || !IsActive(it->second)) {
      return;  // cancelled because the task moved on, ended, or the coordinator stops
    }
    // The stream only ends when the aggregator goes away (or refuses us): the task moves.
    LoseAggregator(it->second.status.aggregator(),
                   absl::StrCat("its watch stream ended: ", status.message()), out);
    Reconcile(out);
  }
  Flush();
}

}  // namespace shoal::coordinator
