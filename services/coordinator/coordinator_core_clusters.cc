// CoordinatorCore: the clusters of hierarchical tasks. The first aggregator of such a task (a
// link) is the root, which adds the partial sums of the others, each serving a cluster of at
// most cluster_size peers (README "Supernode tree rounds"); the root serves peers itself only
// while it is the task's only aggregator. A flat task has one link, its aggregator, serving
// every peer.

#include <algorithm>
#include <cstddef>
#include <limits>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator {
namespace {

bool Hierarchical(const common::v1::TaskSpec& spec) {
  return spec.topology() == common::v1::TOPOLOGY_HIERARCHICAL;
}

}  // namespace

bool CoordinatorCore::Task::MembersConfirmed(const std::vector<uint64_t>& needed) const {
  for (size_t i = 0; i < needed.size() && i < links.size(); ++i) {
    if (links[i].members_acked < needed[i]) return false;
  }
  return true;
}

std::vector<uint64_t> CoordinatorCore::Task::MembersNeeded() const {
  std::vector<uint64_t> needed;
  needed.reserve(links.size());
  for (const Link& link : links) needed.push_back(link.MembersNeeded());
  return needed;
}

std::map<std::string, size_t> CoordinatorCore::AggregatorLoad() const {
  std::map<std::string, size_t> load;
  for (const auto& [name, task] : tasks_) {
    if (!IsActive(task)) continue;
    for (const Task::Link& link : task.links) ++load[link.address];
  }
  return load;
}

void CoordinatorCore::PlacePeer(Task& task, const std::string& peer_id, Outbox& out) {
  if (task.links.empty() || !Hierarchical(task.status.spec())) return;
  UnplacePeer(task, peer_id);
  // The root adds the clusters' partial sums and serves no cluster of its own while another
  // aggregator can: what flows into it is one sum per cluster, not one update per peer.
  const size_t cluster_size = task.status.spec().cluster_size();
  size_t chosen = task.links.size();
  for (size_t i = 1; i < task.links.size(); ++i) {
    if (task.links[i].peers.size() < cluster_size) {
      chosen = i;
      break;
    }
  }
  if (chosen == task.links.size()) {
    // Every cluster is full: a new one on an aggregator the task does not use yet.
    std::set<std::string> used;
    for (const Task::Link& link : task.links) used.insert(link.address);
    const std::string address = pool_.Pick(AggregatorLoad(), used);
    if (!address.empty()) {
      Task::Link& link = task.links.emplace_back();
      link.address = address;
      const AggregatorPool::Entry* entry = pool_.Find(address);
      link.child = entry != nullptr && !entry->identity.empty() ? entry->identity : address;
      LogInfo("task ", task.status.spec().name(), ": cluster ", chosen, " on aggregator ", address,
              " (child '", link.child, "' of the root)");
      StartWatch(task, chosen, out);
    } else if (task.links.size() == 1) {
      chosen = 0;  // the root is the task's only aggregator
    } else {
      // None is free: the smallest cluster takes it, over its size.
      size_t smallest = std::numeric_limits<size_t>::max();
      for (size_t i = 1; i < task.links.size(); ++i) {
        if (task.links[i].peers.size() < smallest) {
          smallest = task.links[i].peers.size();
          chosen = i;
        }
      }
    }
  }
  task.links[chosen].peers.insert(peer_id);
  task.cluster_of[peer_id] = chosen;
}

void CoordinatorCore::UnplacePeer(Task& task, const std::string& peer_id) {
  auto it = task.cluster_of.find(peer_id);
  if (it == task.cluster_of.end()) return;
  if (it->second < task.links.size()) {
    task.links[it->second].peers.erase(peer_id);
    task.links[it->second].members_dirty = true;
  }
  task.cluster_of.erase(it);
}

void CoordinatorCore::MembersChanged(Task& task, const std::string& peer_id) {
  if (task.links.empty()) return;
  task.links[0].members_dirty = true;
  if (auto it = task.cluster_of.find(peer_id);
      it != task.cluster_of.end() && it->second < task.links.size()) {
    task.links[it->second].members_dirty = true;
  }
}

const std::string& CoordinatorCore::AggregatorOf(const Task& task,
                                                 const std::string& peer_id) const {
  if (auto it = task.cluster_of.find(peer_id);
      it != task.cluster_of.end() && it->second < task.links.size()) {
    return task.links[it->second].address;
  }
  return task.status.aggregator();
}

AggregatorTree CoordinatorCore::TreeOf(const Task& task) const {
  AggregatorTree tree;
  if (task.links.empty()) return tree;
  tree.root = task.links[0].address;
  if (!Hierarchical(task.status.spec())) return tree;
  tree.hierarchical = true;
  tree.root_peers = task.links[0].peers;
  for (size_t i = 1; i < task.links.size(); ++i) {
    tree.children.push_back({task.links[i].address, task.links[i].child, task.links[i].peers});
  }
  return tree;
}

void CoordinatorCore::ShowClusters(const Task& task, v1::TaskStatus& status) const {
  if (!Hierarchical(task.status.spec())) return;
  for (size_t i = 0; i < task.links.size(); ++i) {
    v1::ClusterInfo* cluster = status.add_clusters();
    cluster->set_aggregator(task.links[i].address);
    cluster->set_child_id(task.links[i].child);
    cluster->set_level(i == 0 ? 0 : 1);
    for (const std::string& id : task.links[i].peers) cluster->add_peers(id);
  }
}

}  // namespace shoal::coordinator
