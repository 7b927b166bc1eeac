// CoordinatorCore: supernodes elected among the peers (docs/explanation/elections.md). A peer
// that offers to host one (shoal-peer --supernode, Hello.supernode) may be told BecomeSupernode;
// it starts an aggregator that registers naming it as its host, and from then on that
// aggregator is one of the pool like a dedicated one: the placement of hierarchical tasks
// (coordinator_core_clusters.cc) uses it. Peers are elected when the active tasks want more
// aggregators than are free, the well connected first, then by capacity; a task whose tree could
// use newly free aggregators (over-full clusters, or a node clearly better than one of its
// clusters' aggregators: a faster uplink, or more compute) has it rebuilt, at most once per
// interval; an elected aggregator is lost like any other (its watch breaks, its registration
// expires: it stops with its peer's process), the task moving to a new tree and another peer
// elected; one unused for a while is retired.

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"
#include "libs/common/log.h"
#include "libs/task/task_federated.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/host_rank.h"

namespace shoal::coordinator {
namespace {

// The worse of two nodes serving clusters: the slower link when one's upload is under
// kWellConnected of the other's (both measured), else the less compute.
bool Worse(const common::v1::Capacity& a, const common::v1::Capacity& b) {
  if (a.upload_bytes_per_second() > 0 && b.upload_bytes_per_second() > 0) {
    const double best = std::max(a.upload_bytes_per_second(), b.upload_bytes_per_second());
    const bool a_well = WellConnected(a, best);
    if (a_well != WellConnected(b, best)) return !a_well;
  }
  return Compute(a) < Compute(b);
}

// Why ClearlyBetter(candidate, serving, factor) holds, for the log.
std::string Comparison(const common::v1::Capacity& candidate, const common::v1::Capacity& serving,
                       double factor) {
  if (serving.upload_bytes_per_second() > 0 &&
      candidate.upload_bytes_per_second() >= factor * serving.upload_bytes_per_second()) {
    return absl::StrCat(
        absl::SixDigits(candidate.upload_bytes_per_second() / serving.upload_bytes_per_second()),
        "x the upload");
  }
  return absl::StrCat(absl::SixDigits(Compute(candidate) / Compute(serving)), "x the compute");
}

}  // namespace

absl::Status CoordinatorCore::AdoptSupernode(const std::string& host_peer,
                                             const std::string& address, Outbox& out) {
  auto elected = elected_.find(host_peer);
  if (elected != elected_.end() && elected->second.address == address) {
    return absl::OkStatus();  // a refresh
  }
  if (peers_.count(host_peer) == 0 || elected == elected_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("host_peer: \"", host_peer, "\" is not a connected peer elected supernode"));
  }
  const std::string before = elected->second.address;
  elected->second.address = address;
  elected->second.unused_since.reset();
  LogInfo("peer ", host_peer, " serves as supernode: aggregator ", address, " (elected ",
          absl::FormatDuration(clock_.Now() - elected->second.since), " ago)");
  if (!before.empty()) LoseAggregator(before, "its host peer started another one", out);
  return absl::OkStatus();
}

void CoordinatorCore::SupernodeHostLeft(const std::string& peer_id) {
  auto it = elected_.find(peer_id);
  if (it == elected_.end()) return;
  if (it->second.address.empty()) {
    elected_.erase(it);
    metrics_.supernode_ends.Add({{"reason", "host_left"}}).Increment();
    return;
  }
  LogInfo("peer ", peer_id, " left; its supernode ", it->second.address,
          " serves until it is lost (it stops with its peer's process)");
}

void CoordinatorCore::SupernodeLost(const std::string& address) {
  for (auto it = elected_.begin(); it != elected_.end(); ++it) {
    if (it->second.address != address) continue;
    // Its peer is not elected again in this session: it may be dying with its aggregator (the
    // aggregator's stream often breaks before the peer's), or its aggregator cannot run.
    LogWarning("peer ", it->first, ": its supernode ", address,
               " is lost; another peer is elected when one is wanted");
    if (auto peer = peers_.find(it->first); peer != peers_.end()) {
      peer->second.supernode_failed = true;
    }
    metrics_.supernode_ends.Add({{"reason", "lost"}}).Increment();
    elected_.erase(it);
    return;
  }
}

size_t CoordinatorCore::AggregatorsWanted(const Task& task) const {
  if (task.status.aggregator().empty()) return 1;
  if (!task::IsHierarchical(task.status.spec())) return 0;  // it has its one
  const common::v1::TaskSpec& spec = task.status.spec();
  const size_t cluster_size = task::ClusterSizeOf(spec);
  const size_t peers = task.peers.size();
  // The root serves the peers itself while they fit in one cluster; then the root and each
  // cluster below it have their primary and replicas - 1 backups.
  if (peers <= cluster_size) return 1;
  return (1 + (peers + cluster_size - 1) / cluster_size) * task::ReplicasOf(spec);
}

std::string CoordinatorCore::RebuildReason(const Task& task, const std::string& free) const {
  const common::v1::TaskSpec& spec = task.status.spec();
  const size_t cluster_size = task::ClusterSizeOf(spec);
  for (size_t i = 0; i < task.links.size(); ++i) {
    if (task.links[i].peers.size() > cluster_size) {
      return absl::StrCat("the cluster of ", task.links[i].address, " has ",
                          task.links[i].peers.size(), " peers, over ", cluster_size);
    }
  }
  const AggregatorPool::Entry* candidate = pool_.Find(free);
  if (candidate == nullptr) return "";
  // The worst cluster aggregator the free one is clearly better than.
  const AggregatorPool::Entry* worst = nullptr;
  const std::string* worst_address = nullptr;
  for (size_t i = 1; i < task.links.size(); ++i) {
    const AggregatorPool::Entry* serving = pool_.Find(task.links[i].address);
    if (serving == nullptr ||
        !ClearlyBetter(candidate->capacity, serving->capacity, options_.supernodes.better_factor)) {
      continue;
    }
    if (worst == nullptr || Worse(serving->capacity, worst->capacity)) {
      worst = serving;
      worst_address = &task.links[i].address;
    }
  }
  if (worst == nullptr) return "";
  return absl::StrCat(
      "aggregator ", free, " has ",
      Comparison(candidate->capacity, worst->capacity, options_.supernodes.better_factor), " of ",
      *worst_address);
}

void CoordinatorCore::RunElections(Outbox& out) {
  const SupernodeOptions& o = options_.supernodes;
  const absl::Time now = clock_.Now();
  // Elections whose aggregator never came.
  size_t pending = 0;
  for (auto it = elected_.begin(); it != elected_.end();) {
    if (it->second.address.empty() && now - it->second.since > o.election_timeout) {
      LogWarning("peer ", it->first, " was elected supernode ",
                 absl::FormatDuration(now - it->second.since),
                 " ago and its aggregator never registered: passed over");
      if (auto peer = peers_.find(it->first); peer != peers_.end()) {
        peer->second.supernode_failed = true;
      }
      metrics_.supernode_ends.Add({{"reason", "timeout"}}).Increment();
      it = elected_.erase(it);
      continue;
    }
    if (it->second.address.empty()) ++pending;
    ++it;
  }

  std::map<std::string, size_t> load = AggregatorLoad();
  auto usable = [&](const std::string& address, const AggregatorPool::Entry& entry) {
    return load.count(address) == 0 &&
           entry.capacity.reachability() != common::v1::REACHABILITY_UNREACHABLE;
  };
  // Trees that can take in free aggregators are rebuilt (not while elections are pending: the
  // newly elected would cost a second rebuild).
  for (const std::string& name : task_order_) {
    Task& task = tasks_[name];
    if (pending > 0 || !IsActive(task) || task.links.empty() ||
        !task::IsHierarchical(task.status.spec()) || now - task.rebuilt_at < o.rebuild_interval) {
      continue;
    }
    const std::string free = pool_.Pick(load, AddressesOf(task));
    const AggregatorPool::Entry* entry = pool_.Find(free);
    if (entry == nullptr || !usable(free, *entry)) continue;
    const std::string why = RebuildReason(task, free);
    if (why.empty()) continue;
    LogInfo("task ", name, ": rebuilding its tree of aggregators (", why,
            "); the current round starts over");
    task.rebuilt_at = now;
    metrics_.tree_rebuilds.Increment();
    AssignAggregator(task, task.status.aggregator(), out, /*rebuild=*/true);
    load = AggregatorLoad();
  }

  // How many more aggregators the tasks want than are free or coming.
  size_t wanted = 0;
  for (const std::string& name : task_order_) {
    const Task& task = tasks_[name];
    if (!IsActive(task) || !task.UsesAggregator()) continue;
    const size_t have = AddressesOf(task).size();
    const size_t want = AggregatorsWanted(task);
    if (want > have) wanted += want - have;
  }
  size_t free = 0;
  for (const auto& [address, entry] : pool_.entries()) {
    if (usable(address, entry)) ++free;
  }
  // What serves the clusters of the active hierarchical tasks, where its compute or upload is
  // known (a "better" node replaces one: ClearlyBetter).
  std::vector<const common::v1::Capacity*> cluster_aggregators;
  for (const auto& [name, task] : tasks_) {
    if (!IsActive(task) || !task::IsHierarchical(task.status.spec())) continue;
    for (size_t i = 1; i < task.links.size(); ++i) {
      const AggregatorPool::Entry* entry = pool_.Find(task.links[i].address);
      if (entry != nullptr &&
          (Compute(entry->capacity) > 0 || entry->capacity.upload_bytes_per_second() > 0)) {
        cluster_aggregators.push_back(&entry->capacity);
      }
    }
  }
  size_t elect = wanted > free + pending ? wanted - free - pending : 0;
  // A "better" election is possible only when nothing else is wanted or coming and such a
  // cluster aggregator serves; otherwise, and with nothing to elect, the peers are not walked (this
  // runs every Step, with thousands of peers).
  const bool better_possible =
      elect == 0 && wanted == 0 && pending == 0 && free == 0 && !cluster_aggregators.empty();
  std::vector<const Peer*> candidates;
  if (elect > 0 || better_possible) {
    // The candidates, best first: reachable (or not dialled, when the coordinator dials
    // nobody); well connected (an upload at least kWellConnected of the best candidate's: a
    // supernode sends each version to its cluster and takes its updates, so a slow uplink
    // holds up every round it serves); then most compute, fastest upload, most memory available.
    double best_upload = 0;
    for (const auto& [id, peer] : peers_) {
      const common::v1::Reachability r = peer.hello.capacity().reachability();
      const bool reachable =
          r == common::v1::REACHABILITY_REACHABLE ||
          (options_.dialer == nullptr && r != common::v1::REACHABILITY_UNREACHABLE);
      if (peer.hello.supernode() && reachable && !peer.supernode_failed &&
          elected_.count(id) == 0) {
        candidates.push_back(&peer);
        best_upload = std::max(best_upload, peer.hello.capacity().upload_bytes_per_second());
      }
    }
    auto key = [best_upload](const Peer* p) {
      const common::v1::Capacity& c = p->hello.capacity();
      return std::make_tuple(!WellConnected(c, best_upload), -Compute(c),
                             -c.upload_bytes_per_second(),
                             -static_cast<double>(c.memory_available_bytes()), p->id);
    };
    std::sort(candidates.begin(), candidates.end(),
              [&](const Peer* a, const Peer* b) { return key(a) < key(b); });
  }
  const char* reason = "needed";
  if (better_possible && !candidates.empty() &&
      std::any_of(cluster_aggregators.begin(), cluster_aggregators.end(),
                  [&](const common::v1::Capacity* c) {
                    return ClearlyBetter(candidates.front()->hello.capacity(), *c, o.better_factor);
                  })) {
    elect = 1;  // it replaces the worst it beats when its tree is rebuilt
    reason = "better";
  }
  for (size_t i = 0; i < elect && i < candidates.size(); ++i) {
    const Peer& peer = *candidates[i];
    elected_[peer.id] = Elected{now, "", std::nullopt};
    metrics_.supernode_elections.Add({{"reason", reason}}).Increment();
    LogInfo("peer ", peer.id, " elected supernode (", reason, "; ",
            capacity::Describe(peer.hello.capacity()), ")");
    v1::CoordinatorEvent event;
    event.mutable_become_supernode();
    SendTo(peer.id, std::move(event), out);
  }

  // Elected aggregators no task has used for a while, while none is wanted, are retired.
  size_t serving = 0;
  for (auto it = elected_.begin(); it != elected_.end();) {
    Elected& e = it->second;
    if (e.address.empty()) {
      ++it;
      continue;
    }
    if (load.count(e.address) > 0 || wanted > 0) {
      e.unused_since.reset();
    } else if (!e.unused_since.has_value()) {
      e.unused_since = now;
    } else if (now - *e.unused_since >= o.retire_after) {
      LogInfo("peer ", it->first, ": its supernode ", e.address, " is retired (unused for ",
              absl::FormatDuration(now - *e.unused_since), ")");
      v1::CoordinatorEvent event;
      event.mutable_retire_supernode()->set_reason("no task used it");
      SendTo(it->first, std::move(event), out);
      pool_.Remove(e.address);
      metrics_.supernode_ends.Add({{"reason", "retired"}}).Increment();
      it = elected_.erase(it);
      continue;
    }
    ++serving;
    ++it;
  }
  metrics_.supernodes_elected.Set(static_cast<double>(serving));
}

}  // namespace shoal::coordinator
