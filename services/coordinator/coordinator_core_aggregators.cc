// CoordinatorCore: the aggregators of the tasks whose mode uses one. Which aggregator a task
// uses, keeping it told of the members, watching it, moving the task when it is lost, and the
// mode's aggregator work.

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"
#include "libs/common/log.h"
#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator {

absl::Status CoordinatorCore::RegisterAggregator(const std::string& address,
                                                 const common::v1::Capacity& capacity,
                                                 const std::string& identity,
                                                 const std::string& host_peer) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: expected HOST:PORT, got \"", address, "\""));
  }
  Outbox out;
  {
    InputLock lock(*this, out);
    if (!host_peer.empty()) {
      if (absl::Status s = AdoptSupernode(host_peer, address, out); !s.ok()) return s;
    }
    if (pool_.Register(address, capacity, identity, host_peer, clock_.Now())) {
      LogInfo("aggregator ", address, " registered (",
              capacity::Describe(pool_.Find(address)->capacity),
              host_peer.empty() ? "" : absl::StrCat("; elected supernode of peer ", host_peer),
              ")");
      DialBack(/*aggregator=*/true, address, address, nullptr, out);
    }
    metrics_.aggregators_registered.Set(static_cast<double>(pool_.size()));
    Reconcile(out);
  }
  Flush();
  return absl::OkStatus();
}

std::vector<std::string> CoordinatorCore::TasksToRelease(
    const std::string& address, const std::vector<std::string>& held) const {
  std::vector<std::string> release;
  absl::MutexLock lock(&mu_);
  if (stopping_ || fenced_) return release;
  for (const std::string& name : held) {
    auto it = tasks_.find(name);
    if (it == tasks_.end()) {
      // Deleted here, or another coordinator's, or none's: only the first is for this one.
      if (deleted_.count(name) > 0) release.push_back(name);
      continue;
    }
    const Task& task = it->second;
    if (IsActive(task) &&
        (AddressesOf(task).count(address) > 0 || task.former_holders.count(address) > 0 ||
         task.holder_before_restart == address)) {
      continue;
    }
    release.push_back(name);
  }
  return release;
}

void CoordinatorCore::ReconcileAggregators(Outbox& out) {
  const absl::Time now = clock_.Now();
  for (const std::string& address : pool_.Expire(now)) {
    LoseAggregator(address, "it stopped registering", out);
  }
  metrics_.aggregators_registered.Set(static_cast<double>(pool_.size()));
  // Counted only when a task needs an aggregator: this runs at every input, and with shared
  // tasks the count reads every other coordinator's tasks too.
  std::optional<std::map<std::string, size_t>> load;
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task) || !task.UsesAggregator()) continue;
    if (task.status.aggregator().empty()) {
      if (!load.has_value()) load = AggregatorLoad();
      const std::string address = pool_.Pick(*load);
      if (!address.empty()) {
        ++(*load)[address];
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
  // Clusters first, then their backups, from what is left.
  AssignBackups(out);
}

void CoordinatorCore::SendDirtyMembers(Outbox& out) {
  const absl::Time now = clock_.Now();
  for (auto& [name, task] : tasks_) {
    if (!IsActive(task)) continue;
    for (size_t i = 0; i < task.links.size(); ++i) {
      // One call at a time: the changes made while it is in flight go in the next one (its
      // answer sends it), so N joins cost a few calls of the whole membership instead of N.
      const Task::Link& link = task.links[i];
      if (link.members_dirty && link.members_in_flight == 0 && now >= link.members_retry_at) {
        SendMembers(task, i, out);
      }
    }
  }
}

void CoordinatorCore::AssignAggregator(Task& task, const std::string& address, Outbox& out,
                                       bool rebuild) {
  const std::string& name = task.status.spec().name();
  const bool moved =
      rebuild || (task.waiting_for_aggregator_since.has_value() && !task.peers.empty());
  task.status.set_aggregator(address);
  task.waiting_for_aggregator_since.reset();
  NewEpoch(task);
  DropLinks(task);
  task.links.emplace_back();
  task.links[0].address = address;
  LogInfo("task ", name, " uses aggregator ", address);
  StartWatch(task, 0, out);
  for (const std::string& id : task.peers) PlacePeer(task, id, out);
  // Peers assigned before learn the new address (the same spec: they keep their state).
  if (moved) {
    for (const std::string& id : task.peers) SendTo(id, TaskAssignedEvent(task, id), out);
    // The clusters' aggregators forget what they kept of the task (rounds of the tree before),
    // ahead of every call of the new tree on the task's queue; the root does at its restore.
    for (size_t i = 1; i < task.links.size(); ++i) {
      out.push_back(
          [this, name, address = task.links[i].address] { work_.Release(name, address); });
    }
  }
  // Before anything the mode asks of the new aggregators.
  for (size_t i = 0; i < task.links.size(); ++i) SendMembers(task, i, out);
  ModeEffects fx;
  task.mode->OnAggregator(address, clock_.Now(), task.status, fx);
  fx.changed = true;
  ApplyModeEffects(task, fx, out);
}

void CoordinatorCore::LoseAggregator(const std::string& address, const std::string& why,
                                     Outbox& out) {
  if (pool_.Has(address)) pool_.Remove(address);
  SupernodeLost(address);
  bool any = false;
  const absl::Time now = clock_.Now();
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task) || AddressesOf(task).count(address) == 0) continue;
    if (!any) LogWarning("aggregator ", address, " is lost: ", why);
    any = true;
    if (FailOver(task, address, out)) continue;  // a backup's loss, or a backup took over
    // A cluster's aggregator is as necessary as the root: the task starts over on a new tree
    // (from its newest checkpoint), its peers placed again.
    NewEpoch(task);
    DropLinks(task);
    task.former_holders.erase(address);  // gone, or not answering: nothing to free there now
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
  for (Task::Link& link : task.links) {
    link.members_in_flight = 0;
    link.members_acked = link.members_sent;  // the older epoch's calls are ignored
  }
  task.held.clear();
}

void CoordinatorCore::DropLinks(Task& task) {
  const std::set<std::string> held = AddressesOf(task);
  task.former_holders.insert(held.begin(), held.end());
  for (Task::Link& link : task.links) {
    if (link.watch != nullptr) retired_watches_.push_back(std::move(link.watch));
  }
  task.links.clear();
  task.cluster_of.clear();
}

void CoordinatorCore::SendMembers(Task& task, size_t index, Outbox& out) {
  Task::Link& link = task.links[index];
  link.members_dirty = false;
  ++link.members_in_flight;
  const uint64_t version = ++link.members_sent;
  aggregator::v1::SetMembersRequest request;
  // The root knows every peer (it stores the initial model and serves any of them); another
  // cluster's aggregator only its own.
  for (const std::string& id : index == 0 ? task.peers : link.peers) {
    auto peer = peers_.find(id);
    if (peer != peers_.end()) (*request.mutable_session_tokens())[id] = peer->second.session_token;
  }
  // A cluster's backups learn the same members (for the copies of their updates), in order
  // with the task's calls; a failure is only logged (the copies to that backup fail).
  for (const std::string& backup : link.backups) {
    out.push_back([this, name = task.status.spec().name(), backup, request] {
      work_.SetMembers(name, backup, request, [name, backup](absl::Status s) {
        if (!s.ok())
          LogWarning("task ", name, ": set members at backup ", backup, ": ", s.message());
      });
    });
  }
  out.push_back([this, name = task.status.spec().name(), address = link.address, epoch = task.epoch,
                 index, version, request = std::move(request)]() mutable {
    work_.SetMembers(name, address, std::move(request),
                     [this, name, epoch, index, version](absl::Status s) {
                       OnMembersSet(name, epoch, index, version, s);
                     });
  });
}

void CoordinatorCore::PostWork(Task& task, std::vector<AggregatorWork> work, Outbox& out) {
  if (task.links.empty()) return;  // lost meanwhile: the mode starts over later
  // The aggregators learn who may push before anything else happens for the task.
  for (size_t i = 0; i < task.links.size(); ++i) {
    if (task.links[i].members_dirty) SendMembers(task, i, out);
  }
  for (AggregatorWork& w : work) {
    w.id = next_work_++;
    if (w.kind == AggregatorWork::Kind::kRestore) {
      // Where the newest version may still be: the root, its backups, and (after a restart) the
      // aggregator the task used before, if it is registered.
      w.holders.push_back(task.links[0].address);
      for (const std::string& backup : task.links[0].backups) w.holders.push_back(backup);
      const std::string& before = task.holder_before_restart;
      if (!before.empty() && pool_.Has(before) &&
          std::find(w.holders.begin(), w.holders.end(), before) == w.holders.end()) {
        w.holders.push_back(before);
      }
    }
    out.push_back([this, name = task.status.spec().name(), tree = TreeOf(task), epoch = task.epoch,
                   w = std::move(w)]() mutable {
      if (fenced_) return;  // another coordinator has the task now
      work_.Run(name, std::move(tree), std::move(w),
                [this, name, epoch](WorkResult r) { OnWorkDone(name, epoch, r); });
    });
  }
}

void CoordinatorCore::StartWatch(Task& task, size_t index, Outbox& out) {
  Task::Link& link = task.links[index];
  if (link.watch != nullptr) retired_watches_.push_back(std::move(link.watch));
  // Started after the lock is released: the client may deliver the first event inline.
  out.push_back(
      [this, name = task.status.spec().name(), address = link.address, index, epoch = task.epoch] {
        std::unique_ptr<aggregator::AggregatorWatch> watch = aggregators_.WatchTask(
            address, name,
            [this, name, epoch](const aggregator::v1::TaskEvent& e) {
              OnAggregatorEvent(name, epoch, e);
            },
            [this, name, epoch, address](const absl::Status& s) {
              OnWatchDone(name, epoch, address, s);
            });
        absl::MutexLock lock(&mu_);
        auto it = tasks_.find(name);
        if (it != tasks_.end() && it->second.epoch == epoch && !stopping_ &&
            index < it->second.links.size() && it->second.links[index].address == address) {
          it->second.links[index].watch = std::move(watch);
        } else {
          retired_watches_.push_back(std::move(watch));  // the task moved on meanwhile
        }
      });
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
    if (result.work.kind == AggregatorWork::Kind::kRestore) {
      for (Task::Link& link : task.links) link.members_dirty = true;
      if (result.status.ok()) ReleaseFormerHolders(task, out);
    }
    ModeEffects fx;
    task.mode->OnWorkDone(result, clock_.Now(), task.status, fx);
    ApplyModeEffects(task, fx, out);
    Reconcile(out);
  }
  Flush();
}

void CoordinatorCore::ReleaseFormerHolders(Task& task, Outbox& out) {
  std::set<std::string> former = std::move(task.former_holders);
  task.former_holders.clear();
  if (!task.holder_before_restart.empty()) former.insert(task.holder_before_restart);
  task.holder_before_restart.clear();
  const std::set<std::string> current = AddressesOf(task);
  const std::string& name = task.status.spec().name();
  for (const std::string& address : former) {
    if (current.count(address) > 0) continue;  // one of the task's aggregators again
    // What the task left there is freed (fire and forget: one that is gone has nothing to free).
    if (IsActive(task))
      LogInfo("task ", name, ": freeing it at ", address, ", an aggregator of it before");
    out.push_back([this, name, address] { work_.Release(name, address); });
  }
}

void CoordinatorCore::OnMembersSet(const std::string& name, uint64_t epoch, size_t index,
                                   uint64_t members, const absl::Status& status) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end() || it->second.epoch != epoch || index >= it->second.links.size()) {
      return;
    }
    Task& task = it->second;
    Task::Link& link = task.links[index];
    --link.members_in_flight;
    if (!status.ok()) {
      LogWarning("task ", name, ": set members at ", link.address, ": ", status.message(),
                 " (retrying)");
      metrics_.aggregator_errors.Increment();
      link.members_dirty = true;
      link.members_retry_at = clock_.Now() + options_.mode.retry_initial;
      return;  // the held events wait for a SetMembers that succeeds
    }
    link.members_acked = std::max(link.members_acked, members);
    // The events whose membership is confirmed go out, in order; the rest keep waiting.
    size_t released = 0;
    while (released < task.held.size() && task.MembersConfirmed(task.held[released].members)) {
      SendTo(task.held[released].peer, std::move(task.held[released].event), out);
      ++released;
    }
    task.held.erase(task.held.begin(), task.held.begin() + static_cast<ptrdiff_t>(released));
    if (link.members_dirty && link.members_in_flight == 0) SendMembers(task, index, out);
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
                                  const std::string& address, const absl::Status& status) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (stopping_ || it == tasks_.end() || it->second.epoch != epoch || !IsActive(it->second)) {
      return;  // cancelled because the task moved on, ended, or the coordinator stops
    }
    // The stream only ends when the aggregator goes away (or refuses us): the task moves.
    LoseAggregator(address, absl::StrCat("its watch stream ended: ", status.message()), out);
    Reconcile(out);
  }
  Flush();
}

}  // namespace shoal::coordinator
