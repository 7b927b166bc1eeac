// CoordinatorCore: the clusters of hierarchical tasks. The first aggregator of such a task (a
// link) is the root; each other serves a cluster of at most cluster_size peers and sends its
// parent (the root, or another cluster's aggregator: each adds up at most fanout children) the
// partial sum of its cluster and of the clusters below it (docs/explanation/supernode-trees.md).
// The root serves peers itself only while it is the task's only aggregator. A flat task has one
// link, its aggregator, serving every peer.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/task/task_federated.h"
#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator {

std::map<std::string, size_t> CoordinatorCore::AggregatorLoad() const {
  // With shared tasks, the others' too: every coordinator gives its aggregators' work out.
  std::map<std::string, size_t> load =
      placement_ != nullptr ? placement_->OthersAggregatorLoad() : std::map<std::string, size_t>();
  for (const auto& [name, task] : tasks_) {
    if (!IsActive(task)) continue;
    for (const std::string& address : AddressesOf(task)) ++load[address];
  }
  return load;
}

namespace {

// Round trips this close to the nearest count as near as it: within 5 ms, or twice the nearest
// (measurement noise on one network, a loaded machine's included: loopback measured 1.3 and
// 3.2 ms under a test suite; another region is tens of milliseconds away).
bool NearAsNearest(uint32_t rtt_us, uint32_t nearest_us) {
  return rtt_us <= nearest_us + std::max<uint32_t>(5000, nearest_us);
}

}  // namespace

std::string CoordinatorCore::PickNewCluster(const Task& task, const RttMap& rtts) const {
  std::set<std::string> exclude = AddressesOf(task);
  uint32_t nearest = std::numeric_limits<uint32_t>::max();
  for (const auto& [address, entry] : pool_.entries()) {
    auto it = rtts.find(address);
    if (exclude.count(address) == 0 && it != rtts.end()) nearest = std::min(nearest, it->second);
  }
  if (nearest != std::numeric_limits<uint32_t>::max()) {
    for (const auto& [address, entry] : pool_.entries()) {
      auto it = rtts.find(address);
      if (it == rtts.end() || !NearAsNearest(it->second, nearest)) exclude.insert(address);
    }
  }
  return pool_.Pick(AggregatorLoad(), exclude);
}

void CoordinatorCore::PlacePeer(Task& task, const std::string& peer_id, Outbox& out) {
  if (task.links.empty() || !task::IsHierarchical(task.status.spec())) return;
  UnplacePeer(task, peer_id);
  // The root adds the clusters' partial sums and serves no cluster of its own while another
  // aggregator can: what flows into it is one sum per cluster, not one update per peer.
  const common::v1::TaskSpec& spec = task.status.spec();
  // (Specs created through the API have both set; 0 would leave no room.)
  const size_t cluster_size = task::ClusterSizeOf(spec);
  const size_t fanout = spec.has_fanout() ? spec.fanout() : task::kDefaultFanout;
  RttMap rtts;
  if (auto p = peers_.find(peer_id); p != peers_.end()) {
    for (const common::v1::AggregatorRtt& rtt : p->second.hello.capacity().aggregator_rtts()) {
      rtts[rtt.address()] = rtt.rtt_us();
    }
  }
  // The nearest cluster with room it measured; else the first with room (by arrival).
  uint32_t nearest = std::numeric_limits<uint32_t>::max();
  for (size_t i = 1; i < task.links.size(); ++i) {
    auto it = rtts.find(task.links[i].address);
    if (task.links[i].peers.size() < cluster_size && it != rtts.end()) {
      nearest = std::min(nearest, it->second);
    }
  }
  const bool measured = nearest != std::numeric_limits<uint32_t>::max();
  size_t chosen = task.links.size();
  for (size_t i = 1; i < task.links.size(); ++i) {
    auto it = rtts.find(task.links[i].address);
    if (task.links[i].peers.size() < cluster_size &&
        (!measured || (it != rtts.end() && NearAsNearest(it->second, nearest)))) {
      chosen = i;
      break;
    }
  }
  std::string address;  // of a new cluster
  if (chosen == task.links.size()) {
    // Every cluster is full: a new one on an aggregator the task does not use yet.
    address = PickNewCluster(task, rtts);
    // Clusters come before backups: with no free aggregator, a cluster's backup (of the one
    // with the most) serves the new cluster instead.
    if (address.empty()) address = TakeBackup(task, out);
  } else if (measured) {
    // Its nearest cluster with room is far (another region) and a free aggregator is not.
    const std::string free = PickNewCluster(task, rtts);
    if (auto it = rtts.find(free); it != rtts.end() && !NearAsNearest(nearest, it->second)) {
      LogInfo("task ", spec.name(), ": peer ", peer_id, " measured ", free, " at ",
              it->second / 1e3, " ms and its nearest cluster with room at ", nearest / 1e3,
              " ms: a new cluster");
      address = free;
      chosen = task.links.size();
    }
  }
  if (chosen == task.links.size()) {
    if (!address.empty()) {
      // Below the first aggregator (the root, then the clusters in the order they opened:
      // level by level) that adds up fewer than fanout children.
      std::vector<size_t> children(task.links.size(), 0);
      for (size_t i = 1; i < task.links.size(); ++i) ++children[task.links[i].parent];
      size_t parent = 0;
      while (parent + 1 < task.links.size() && children[parent] >= fanout) {
        ++parent;
      }
      Task::Link& link = task.links.emplace_back();
      link.address = address;
      link.parent = parent;
      link.level = task.links[parent].level + 1;
      link.child = ChildId(address);
      LogInfo("task ", task.status.spec().name(), ": cluster ", chosen, " on aggregator ", address,
              " (child '", link.child, "' of ", task.links[parent].address, ", level ", link.level,
              ")");
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

std::string CoordinatorCore::ChildId(const std::string& address) const {
  const AggregatorPool::Entry* entry = pool_.Find(address);
  if (entry == nullptr || entry->identity.empty()) return address;  // plaintext
  // Aggregators that share a certificate (deploy/k8s) are told apart by their address; the
  // parent still checks the certificate's name (aggregator::IsChildOf).
  for (const auto& [other, e] : pool_.entries()) {
    if (other != address && e.identity == entry->identity) {
      return absl::StrCat(entry->identity, "@", address);
    }
  }
  return entry->identity;
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
  tree.hierarchical = task::IsHierarchical(task.status.spec());
  for (const Task::Link& link : task.links) {
    AggregatorTree::Node& node = tree.nodes.emplace_back();
    node.address = link.address;
    node.id = link.child;
    node.parent = link.parent;
    node.level = link.level;
    if (!tree.hierarchical) break;  // a flat task's one aggregator serves every peer
    node.peers = link.peers;
    node.backups = link.backups;
    for (const std::string& backup : link.backups) node.backup_ids.push_back(ChildId(backup));
    if (!link.backups.empty()) node.self_id = ChildId(link.address);
  }
  return tree;
}

void CoordinatorCore::ShowClusters(const Task& task, v1::TaskStatus& status) const {
  if (!task::IsHierarchical(task.status.spec())) return;
  for (size_t i = 0; i < task.links.size(); ++i) {
    v1::ClusterInfo* cluster = status.add_clusters();
    cluster->set_aggregator(task.links[i].address);
    cluster->set_child_id(task.links[i].child);
    cluster->set_level(task.links[i].level);
    if (i > 0) cluster->set_parent(task.links[task.links[i].parent].address);
    if (const AggregatorPool::Entry* entry = pool_.Find(task.links[i].address)) {
      cluster->set_host_peer(entry->host_peer);
    }
    for (const std::string& id : task.links[i].peers) cluster->add_peers(id);
    for (const std::string& backup : task.links[i].backups) cluster->add_backups(backup);
  }
}

void CoordinatorCore::UpdateTreeMetrics() {
  size_t clusters = 0;
  size_t missing = 0;
  uint32_t depth = 0;
  for (const auto& [name, task] : tasks_) {
    if (!IsActive(task) || !task::IsHierarchical(task.status.spec()) || task.links.empty())
      continue;
    clusters += task.links.size() - 1;
    const size_t want = task.links.size() > 1 ? task::ReplicasOf(task.status.spec()) - 1 : 0;
    for (const Task::Link& link : task.links) {
      missing += want - std::min(want, link.backups.size());
    }
    for (const Task::Link& link : task.links) depth = std::max(depth, link.level);
  }
  metrics_.tree_clusters.Set(static_cast<double>(clusters));
  metrics_.backups_missing.Set(static_cast<double>(missing));
  metrics_.tree_depth.Set(depth);
}

}  // namespace shoal::coordinator
