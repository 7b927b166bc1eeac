// CoordinatorCore: the replicas of hierarchical tasks (TaskSpec.replicas). Each cluster below
// the root, then the root, gets replicas - 1 backups from the registered aggregators the task
// does not use otherwise; the primary copies every update it accepts to them before it answers
// the peer (aggregator side: OpenRoundRequest.backups, standby_for), and the root's backups
// fetch each version it publishes. When a primary is lost, its first backup takes its place:
// the round goes on there, with every update a peer was told is in
// (docs/explanation/replicas.md).

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/task/task_federated.h"
#include "libs/task/task_privacy.h"
#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator {

std::set<std::string> CoordinatorCore::AddressesOf(const Task& task) {
  std::set<std::string> used;
  for (const Task::Link& link : task.links) {
    used.insert(link.address);
    used.insert(link.backups.begin(), link.backups.end());
  }
  return used;
}

void CoordinatorCore::AssignBackups(Outbox& out) {
  std::map<std::string, size_t> load;
  bool loaded = false;
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (!IsActive(task) || task.links.size() < 2 || !task::IsHierarchical(task.status.spec())) {
      continue;
    }
    const size_t want = task::ReplicasOf(task.status.spec()) - 1;
    // The clusters below the root first (there are more of them to lose), the root last.
    for (size_t k = 1; k <= task.links.size(); ++k) {
      const size_t i = k % task.links.size();
      Task::Link& link = task.links[i];
      while (link.backups.size() < want) {
        if (!loaded) {
          load = AggregatorLoad();
          loaded = true;
        }
        const std::string address = pool_.Pick(load, AddressesOf(task));
        if (address.empty()) return;  // none free: the clusters wait for more registrations
        ++load[address];
        link.backups.push_back(address);
        metrics_.backups_assigned.Increment();
        LogInfo("task ", name, ": aggregator ", address, " is backup ", link.backups.size(),
                i == 0 ? " of the root " : " of the cluster of ", link.address,
                " (from its next round)");
        // It forgets what it kept of the task (a round of an earlier tree) before it learns the
        // cluster's members: both ahead of the task's next round on its queue.
        out.push_back([this, name, address] { work_.Release(name, address); });
        link.members_dirty = true;
      }
    }
  }
}

std::string CoordinatorCore::TakeBackup(Task& task, Outbox& out) {
  Task::Link* most = nullptr;
  for (size_t i = 0; i < task.links.size(); ++i) {
    Task::Link& link = task.links[i];
    if (!link.backups.empty() && (most == nullptr || link.backups.size() > most->backups.size())) {
      most = &link;
    }
  }
  if (most == nullptr) return "";
  std::string address = most->backups.back();
  most->backups.pop_back();
  LogInfo("task ", task.status.spec().name(), ": backup ", address, " of ", most->address,
          " serves a new cluster instead");
  // What it kept as a backup (a standby round) is forgotten before it serves, ahead of the
  // task's next round on its queue.
  out.push_back(
      [this, name = task.status.spec().name(), address] { work_.Release(name, address); });
  return address;
}

bool CoordinatorCore::FailOver(Task& task, const std::string& address, Outbox& out) {
  const std::string& name = task.status.spec().name();
  for (size_t i = 0; i < task.links.size(); ++i) {
    Task::Link& link = task.links[i];
    if (auto b = std::find(link.backups.begin(), link.backups.end(), address);
        b != link.backups.end()) {
      link.backups.erase(b);
      LogWarning("task ", name, ": backup ", address,
                 i == 0 ? " of the root " : " of the cluster of ", link.address, " is lost (",
                 link.backups.size(), " left)");
      return true;
    }
    if (link.address != address) continue;
    if (link.backups.empty()) return false;
    const std::string backup = link.backups.front();
    link.backups.erase(link.backups.begin());
    if (i == 0) {
      LogWarning("task ", name, ": the root ", address, " is lost; its backup ", backup,
                 " takes over (the round goes on)");
      task.status.set_aggregator(backup);  // where the task's models are from now on
      MarkChanged(task, out);
    } else {
      LogWarning("task ", name, ": aggregator ", address, " of a cluster of ", link.peers.size(),
                 " peers is lost; its backup ", backup,
                 task::HasSecureAggregation(task.status.spec())
                     ? " takes over (the round's secure aggregation starts again there, from its "
                       "first step, with fresh keys and masks)"
                     : " takes over (the round goes on)");
    }
    metrics_.failovers.Increment();
    link.address = backup;  // its child id stays: the parent takes its partial sum as before
    link.members_dirty = true;
    StartWatch(task, i, out);
    out.push_back([this, name, address, backup, backup_id = ChildId(backup), epoch = task.epoch] {
      work_.Promote(name, address, backup, backup_id, [this, name, epoch, backup](absl::Status s) {
        // Lost too: as if its watch broke (the task starts over when nothing is left).
        if (!s.ok()) {
          OnWatchDone(name, epoch, backup,
                      absl::Status(s.code(), absl::StrCat("promotion failed: ", s.message())));
        }
      });
    });
    return true;
  }
  return false;
}

}  // namespace shoal::coordinator
