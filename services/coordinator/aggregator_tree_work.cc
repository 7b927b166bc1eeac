// AggregatorWorkRunner: the rounds of a hierarchical task, run on its tree of aggregators (the
// root, and one node per cluster below it, at any depth). Idempotent step by step, like the
// calls it makes: a failed open or close is asked again by the mode and repeats only what is
// needed (a node's repeated CloseRound sends the same partial sum, counted once by its parent).

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/log.h"
#include "services/coordinator/aggregator_work.h"

namespace shoal::coordinator {
namespace {

using Node = AggregatorTree::Node;

// Calls to the aggregators of one level of a tree run at most this many at a time.
constexpr size_t kParallelCalls = 16;

absl::Status AtNode(const absl::Status& s, const Node& node) {
  return absl::Status(s.code(), absl::StrCat("cluster of aggregator ", node.address, " (child '",
                                             node.id, "'): ", s.message()));
}

// Runs `call` for each of `nodes` (indices), kParallelCalls at a time, on threads joined before
// it returns; the first failure in the order of `nodes` is the result.
absl::Status CallEach(const std::vector<size_t>& nodes,
                      const std::function<absl::Status(size_t)>& call) {
  std::vector<absl::Status> results(nodes.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t k = next++; k < nodes.size(); k = next++) results[k] = call(nodes[k]);
  };
  {
    std::vector<std::thread> helpers;
    struct Join {
      std::vector<std::thread>& threads;
      ~Join() {
        for (std::thread& t : threads) t.join();
      }
    } join{helpers};
    for (size_t t = 1; t < std::min(nodes.size(), kParallelCalls); ++t) helpers.emplace_back(work);
    work();
  }
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The id a node's copies carry to its backups.
const std::string& SelfId(const Node& node) {
  return node.self_id.empty() ? node.id : node.self_id;
}

// Where each peer of a cluster pushes: the index of its cluster's node. A peer in no cluster
// pushes to the root (NodeOf gives 0).
class PeerNodes {
 public:
  explicit PeerNodes(const AggregatorTree& tree) {
    for (size_t i = 1; i < tree.nodes.size(); ++i) {
      for (const std::string& peer : tree.nodes[i].peers) node_.emplace(peer, i);
    }
  }
  size_t NodeOf(const std::string& peer) const {
    auto it = node_.find(peer);
    return it == node_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, size_t> node_;
};

// The indices of `nodes` for which `wanted` holds, grouped by level, the root's level first.
std::vector<std::vector<size_t>> ByLevel(const std::vector<Node>& nodes,
                                         const std::function<bool(size_t)>& wanted) {
  std::vector<std::vector<size_t>> levels;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!wanted(i)) continue;
    if (levels.size() <= nodes[i].level) levels.resize(nodes[i].level + 1);
    levels[nodes[i].level].push_back(i);
  }
  return levels;
}

// The fewest peers a secure round masks among (libs/privacy/secagg/round.h, kMinParticipants).
constexpr int kMinSecurePeers = 3;

// Secure aggregation on a tree: each cluster's peers of the round are one secure round at their
// node, which gets their identity keys alone; a node without peers of the round adds up its
// children's sums in a plain round. A cluster with fewer than kMinSecurePeers of the round's
// peers cannot mask among them, and peers in no cluster (at the root) cannot go in a round with
// clusters below it: both sit the round out, removed from `opens` and from `open`'s expected
// peers (so the coordinator does not expect them). Returns the groups.
std::vector<std::vector<std::string>> SplitSecureGroups(
    const std::string& task, std::vector<aggregator::v1::OpenRoundRequest>& opens,
    aggregator::v1::OpenRoundRequest& open) {
  std::set<std::string> out;
  bool clusters = false;
  for (size_t i = 1; i < opens.size(); ++i) {
    const int peers = opens[i].expected_peers_size();
    if (peers >= kMinSecurePeers) clusters = true;
    if (peers > 0 && peers < kMinSecurePeers) {
      out.insert(opens[i].expected_peers().begin(), opens[i].expected_peers().end());
      opens[i].clear_expected_peers();
    }
  }
  if (clusters && opens[0].expected_peers_size() > 0) {
    out.insert(opens[0].expected_peers().begin(), opens[0].expected_peers().end());
    opens[0].clear_expected_peers();
  }
  std::vector<std::vector<std::string>> groups;
  for (aggregator::v1::OpenRoundRequest& o : opens) {
    if (o.expected_peers_size() == 0) {
      o.clear_secure_aggregation();
      continue;
    }
    auto& keys = *o.mutable_secure_aggregation()->mutable_identity_keys();
    keys.clear();
    for (const std::string& peer : o.expected_peers()) {
      keys[peer] = open.secure_aggregation().identity_keys().at(peer);
    }
    groups.emplace_back(o.expected_peers().begin(), o.expected_peers().end());
  }
  if (!out.empty()) {
    LogWarning("task ", task, ": round ", open.round(), ": peers ", absl::StrJoin(out, ", "),
               " sit this round out: secure aggregation masks among at least ", kMinSecurePeers,
               " peers of one cluster");
    google::protobuf::RepeatedPtrField<std::string> kept;
    for (const std::string& peer : open.expected_peers()) {
      if (out.count(peer) == 0) *kept.Add() = peer;
    }
    open.mutable_expected_peers()->Swap(&kept);
    for (const std::string& peer : out) {
      open.mutable_secure_aggregation()->mutable_identity_keys()->erase(peer);
    }
  }
  return groups;
}

}  // namespace

absl::Status AggregatorWorkRunner::OpenTree(const std::string& task, const AggregatorTree& tree,
                                            aggregator::v1::OpenRoundRequest& open,
                                            std::vector<std::vector<std::string>>& secure_groups) {
  const size_t n = tree.nodes.size();
  std::vector<aggregator::v1::OpenRoundRequest> opens(n, open);
  for (aggregator::v1::OpenRoundRequest& o : opens) {
    o.clear_expected_peers();
    o.clear_late_peers();
  }
  // Each peer of the round pushes to its cluster's aggregator, on time or late (a straggler in
  // asynchronous contribution, weighted there by its staleness); one in no cluster to the root.
  const PeerNodes peer_nodes(tree);
  for (const std::string& peer : open.expected_peers()) {
    opens[peer_nodes.NodeOf(peer)].add_expected_peers(peer);
  }
  for (const std::string& peer : open.late_peers()) {
    opens[peer_nodes.NodeOf(peer)].add_late_peers(peer);
  }
  for (aggregator::v1::OpenRoundRequest& o : opens) {
    if (o.late_peers_size() == 0) o.clear_late_staleness();
  }
  secure_groups.clear();
  if (open.secure_aggregation().enabled()) secure_groups = SplitSecureGroups(task, opens, open);
  // Peer-level DP: only the root adds noise, for the whole round's peers (those a secure round
  // left out are not expected); every node gets the count (a secure cluster sizes its peers'
  // noise shares by it).
  if (open.has_dp()) {
    for (aggregator::v1::OpenRoundRequest& o : opens) {
      o.set_dp_round_peers(static_cast<uint32_t>(open.expected_peers_size()));
    }
  }
  // A node takes part when peers of the round are in its cluster or below it. Every child is
  // named to its parent (so that each may fetch its parent's versions), whether or not it takes
  // part; those that do send their parent a partial sum.
  std::vector<bool> active(n, false);
  active[0] = true;
  for (size_t i = n; i-- > 1;) {
    if (opens[i].expected_peers_size() > 0 || opens[i].late_peers_size() > 0) active[i] = true;
    if (active[i]) active[tree.nodes[i].parent] = true;
  }
  for (size_t i = 1; i < n; ++i) {
    const Node& node = tree.nodes[i];
    opens[node.parent].add_expected_children(node.id);
    for (const std::string& backup : node.backup_ids) {
      aggregator::v1::ChildBackup* b = opens[node.parent].add_child_backups();
      b->set_child(node.id);
      b->set_backup(backup);
    }
    opens[i].mutable_parent()->set_address(tree.nodes[node.parent].address);
    opens[i].mutable_parent()->set_child(node.id);
  }
  // The root's backups fetch its versions as its children: it names them.
  const Node& root = tree.nodes[0];
  for (const std::string& id : root.backup_ids) opens[0].add_expected_children(id);
  // From the root down, a level at a time (the nodes of a level in parallel): a node that does
  // not hold the base version fetches it from its parent (a transfer), which has it by then.
  // Replicas: a node's backups first, each with a standby round (the same round, taking only
  // the node's copies); the node copies to those that opened. The root's backups have their
  // standby's base version from the root: it opens first, and again with its backups.
  std::map<std::string, aggregator::v1::OpenRoundRequest> standbys;
  std::set<std::string> root_standbys;
  for (const std::vector<size_t>& level :
       ByLevel(tree.nodes, [&](size_t i) { return active[i]; })) {
    struct Backup {
      size_t node;
      std::string address;
      std::string id;
    };
    std::vector<Backup> backups;
    for (size_t i : level) {
      const Node& node = tree.nodes[i];
      for (size_t b = 0; b < node.backups.size(); ++b) {
        backups.push_back(
            {i, node.backups[b], b < node.backup_ids.size() ? node.backup_ids[b] : ""});
      }
    }
    if (level.front() == 0 && !root.backups.empty()) {
      if (absl::Status s =
              client_.OpenRound(root.address, opens[0], clock_.Now() + options_.call_timeout);
          !s.ok()) {
        return s;
      }
    }
    std::vector<aggregator::v1::OpenRoundRequest> standby(backups.size());
    // One byte per flag: the calls set theirs in parallel (std::vector<bool> packs them into
    // shared words, a data race that ThreadSanitizer found).
    std::vector<char> standby_open(backups.size(), 0);
    std::vector<size_t> all(backups.size());
    for (size_t k = 0; k < backups.size(); ++k) all[k] = k;
    CallEach(all, [&](size_t k) {
      const size_t i = backups[k].node;
      const std::string& address = backups[k].address;
      standby[k] = opens[i];
      standby[k].set_standby_for(SelfId(tree.nodes[i]));
      if (i == 0) {  // the root's: its versions come from the root, as its child
        standby[k].mutable_parent()->set_address(root.address);
        standby[k].mutable_parent()->set_child(backups[k].id);
      }
      absl::Status opened =
          client_.OpenRound(address, standby[k], clock_.Now() + options_.transfer_timeout);
      if (!opened.ok()) {
        LogWarning("task ", task, ": backup ", address, " of ", tree.nodes[i].address,
                   " takes no copies of round ", open.round(), ": ", opened.message());
      }
      standby_open[k] = opened.ok();
      return absl::OkStatus();
    }).IgnoreError();
    for (size_t k = 0; k < backups.size(); ++k) {
      if (!standby_open[k]) continue;
      const size_t i = backups[k].node;
      // A secure round's primary copies nothing: its standbys start the round again when one
      // takes over (sessions/secure_session.h).
      if (!opens[i].secure_aggregation().enabled()) {
        opens[i].add_backups(backups[k].address);
        opens[i].set_replica_id(SelfId(tree.nodes[i]));
      }
      if (i == 0) root_standbys.insert(backups[k].address);
      standbys[backups[k].address] = std::move(standby[k]);
    }
    absl::Status s = CallEach(level, [&](size_t i) {
      const absl::Duration limit = i == 0 ? options_.call_timeout : options_.transfer_timeout;
      absl::Status opened =
          client_.OpenRound(tree.nodes[i].address, opens[i], clock_.Now() + limit);
      return opened.ok() || i == 0 ? opened : AtNode(opened, tree.nodes[i]);
    });
    if (!s.ok()) return s;
  }
  TreeRound round;
  round.round = open.round();
  round.root = root.address;
  for (size_t i = 1; i < n; ++i) {
    if (!active[i]) continue;
    round.nodes.push_back(tree.nodes[i]);
    round.opens.push_back(std::move(opens[i]));
  }
  round.standbys = std::move(standbys);
  round.root_standbys = std::move(root_standbys);
  absl::MutexLock lock(&mu_);
  tree_rounds_[task] = std::move(round);
  return absl::OkStatus();
}

absl::StatusOr<aggregator::v1::CloseRoundResponse> AggregatorWorkRunner::CloseTree(
    const std::string& task, const AggregatorTree& tree,
    const aggregator::v1::CloseRoundRequest& close) {
  std::vector<Node> opened;  // the nodes below the root the round was opened on
  std::map<std::string, aggregator::v1::OpenRoundRequest> retell;
  {
    absl::MutexLock lock(&mu_);
    auto it = tree_rounds_.find(task);
    if (it != tree_rounds_.end() && it->second.round == close.round()) {
      opened = it->second.nodes;
      retell = it->second.retell;
    }
  }
  // Nodes not told yet that the root changed learn their new parent first.
  for (const auto& [address, open] : retell) {
    if (absl::Status s = client_.OpenRound(address, open, clock_.Now() + options_.call_timeout);
        !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("telling aggregator ", address, " its new parent: ", s.message()));
    }
    absl::MutexLock lock(&mu_);
    tree_rounds_[task].retell.erase(address);
  }
  // The deepest level first (its nodes in parallel): each sends its parent its partial sum (a
  // transfer) before the parent closes and sends its own, which includes it.
  std::vector<std::vector<size_t>> levels = ByLevel(opened, [](size_t) { return true; });
  for (auto level = levels.rbegin(); level != levels.rend(); ++level) {
    absl::Status s = CallEach(*level, [&](size_t k) -> absl::Status {
      absl::StatusOr<aggregator::v1::CloseRoundResponse> forwarded =
          client_.CloseRound(opened[k].address, close, clock_.Now() + options_.transfer_timeout);
      return forwarded.ok() ? absl::OkStatus() : AtNode(forwarded.status(), opened[k]);
    });
    if (!s.ok()) return s;
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> closed =
      client_.CloseRound(tree.root(), close, clock_.Now() + options_.call_timeout);
  if (!closed.ok()) return closed.status();
  {
    // Closed: no backup takes this round over any more.
    absl::MutexLock lock(&mu_);
    auto it = tree_rounds_.find(task);
    if (it != tree_rounds_.end() && it->second.round == close.round()) {
      it->second.standbys.clear();
      it->second.closed = true;
    }
  }
  // Every cluster's peers evaluate the new version at their own aggregator.
  PullTree(task, tree, closed->version());
  return closed;
}

absl::Status AggregatorWorkRunner::PromoteRoot(const std::string& task, const std::string& primary,
                                               const std::string& backup,
                                               const std::string& backup_id) {
  std::optional<aggregator::v1::OpenRoundRequest> open;
  // Opened again: the root's other backups (standby for the new root, their versions from it),
  // then the nodes whose parent was the lost root (their partial sums go to the new one).
  Opens backups, children;
  uint64_t number = 0;
  {
    absl::MutexLock lock(&mu_);
    TreeRound& round = tree_rounds_[task];
    number = round.round;
    round.root = backup;
    auto standby = round.standbys.find(backup);
    if (round.closed) return absl::OkStatus();  // the next round opens on the new tree
    if (standby == round.standbys.end() || round.root_standbys.count(backup) == 0) {
      // Without the round it lacks the base version, maybe the root's own peers' updates: the
      // task starts over from its checkpoint.
      return absl::FailedPreconditionError(
          absl::StrCat("backup ", backup, " of the root holds no standby of round ", number));
    }
    open = std::move(standby->second);
    round.standbys.erase(standby);
    round.root_standbys.erase(backup);
    open->clear_standby_for();
    open->clear_parent();
    open->set_replica_id(backup_id);
    auto* named = open->mutable_expected_children();
    named->erase(std::remove(named->begin(), named->end(), backup_id), named->end());
    backups = Restandby({round.root_standbys.begin(), round.root_standbys.end()}, backup_id, backup,
                        round.standbys, *open);
    for (size_t k = 0; k < round.nodes.size(); ++k) {
      if (round.opens[k].parent().address() != primary) continue;
      round.opens[k].mutable_parent()->set_address(backup);
      children.emplace_back(round.nodes[k].address, round.opens[k]);
    }
    for (auto& [address, o] : round.standbys) {
      if (round.root_standbys.count(address) > 0 || o.parent().address() != primary) continue;
      o.mutable_parent()->set_address(backup);
      children.emplace_back(address, o);
    }
  }
  LogWarning("task ", task, ": backup ", backup, " takes round ", number,
             " over from the lost root ", primary);
  if (absl::Status s = client_.OpenRound(backup, *open, clock_.Now() + options_.call_timeout);
      !s.ok()) {
    return s;
  }
  OpenStandbys(task, backup, backups, options_.transfer_timeout);
  // One that cannot be told now is told before its CloseRound (CloseTree).
  std::vector<size_t> all(children.size());
  for (size_t k = 0; k < children.size(); ++k) all[k] = k;
  std::vector<char> told(children.size(), 0);
  CallEach(all, [&](size_t k) {
    absl::Status s = client_.OpenRound(children[k].first, children[k].second,
                                       clock_.Now() + options_.call_timeout);
    if (!s.ok()) {
      LogWarning("task ", task, ": aggregator ", children[k].first, " below the new root ", backup,
                 ": ", s.message());
    }
    told[k] = s.ok();
    return absl::OkStatus();
  }).IgnoreError();
  absl::MutexLock lock(&mu_);
  TreeRound& round = tree_rounds_[task];
  for (size_t k = 0; k < children.size(); ++k) {
    if (!told[k]) round.retell[children[k].first] = children[k].second;
  }
  return absl::OkStatus();
}

void AggregatorWorkRunner::PullTree(const std::string& task, const AggregatorTree& tree,
                                    uint64_t version) {
  // The root's backups first: one that lacks the new version cannot take the root over before
  // the next round.
  const Node& root = tree.nodes[0];
  std::vector<size_t> backups;
  for (size_t b = 0; b < root.backups.size() && b < root.backup_ids.size(); ++b) {
    backups.push_back(b);
  }
  CallEach(backups, [&](size_t b) {
    absl::StatusOr<bool> pulled =
        PullFrom(task, version, root.backups[b], root.address, root.backup_ids[b]);
    if (!pulled.ok()) {
      LogWarning("task ", task, ": backup ", root.backups[b],
                 " of the root: ", pulled.status().message());
    }
    return absl::OkStatus();
  }).IgnoreError();
  // Each node fetches the version from its parent, from the top down (each aggregator sends one
  // model per child, not one per peer). A node that cannot is only logged: it fetches the
  // version with its next round (or pull), and a lost node moves the task anyway.
  for (const std::vector<size_t>& level : ByLevel(tree.nodes, [](size_t i) { return i > 0; })) {
    CallEach(level, [&](size_t i) {
      const Node& node = tree.nodes[i];
      absl::StatusOr<bool> pulled =
          PullFrom(task, version, node.address, tree.nodes[node.parent].address, node.id);
      if (!pulled.ok()) LogWarning("task ", task, ": ", AtNode(pulled.status(), node).message());
      return absl::OkStatus();
    }).IgnoreError();
  }
}

absl::StatusOr<bool> AggregatorWorkRunner::PullFrom(const std::string& task, uint64_t version,
                                                    const std::string& address,
                                                    const std::string& parent,
                                                    const std::string& child) {
  aggregator::v1::PullModelRequest pull;
  pull.set_task(task);
  pull.set_version(version);
  pull.mutable_parent()->set_address(parent);
  pull.mutable_parent()->set_child(child);
  return client_.PullModel(address, pull, clock_.Now() + options_.transfer_timeout);
}

absl::Status AggregatorWorkRunner::OpenBufferTree(const std::string& task,
                                                  const AggregatorTree& tree,
                                                  const aggregator::v1::OpenBufferRequest& open,
                                                  const std::vector<std::string>& peers) {
  const size_t n = tree.nodes.size();
  // The peers below each node: its cluster's (a peer in no cluster pushes to the root) and
  // those below its children.
  std::vector<size_t> below(n, 0);
  const PeerNodes peer_nodes(tree);
  for (const std::string& peer : peers) ++below[peer_nodes.NodeOf(peer)];
  for (size_t i = n; i-- > 1;) below[tree.nodes[i].parent] += below[i];  // children come later
  std::vector<aggregator::v1::OpenBufferRequest> opens(n, open);
  for (size_t i = 1; i < n; ++i) {
    if (below[i] == 0) continue;
    const Node& node = tree.nodes[i];
    opens[node.parent].add_children(node.id);
    opens[i].mutable_parent()->set_address(tree.nodes[node.parent].address);
    opens[i].mutable_parent()->set_child(node.id);
  }
  // A node's buffer fills with buffer_size peers' updates, or all those below it when fewer (a
  // child's aggregate counts as the updates it holds).
  for (size_t i = 0; i < n; ++i) {
    const uint64_t wanted = open.async().buffer_size();
    opens[i].mutable_async()->set_buffer_size(
        static_cast<uint32_t>(std::min<uint64_t>(wanted, std::max<size_t>(below[i], 1))));
  }
  // From the root down, a level at a time: a node that does not hold the base version fetches
  // it from its parent (a transfer), which has it by then.
  for (const std::vector<size_t>& level :
       ByLevel(tree.nodes, [&](size_t i) { return i == 0 || below[i] > 0; })) {
    absl::Status s = CallEach(level, [&](size_t i) {
      const absl::Duration limit = i == 0 ? options_.call_timeout : options_.transfer_timeout;
      absl::Status opened =
          client_.OpenBuffer(tree.nodes[i].address, opens[i], clock_.Now() + limit);
      return opened.ok() || i == 0 ? opened : AtNode(opened, tree.nodes[i]);
    });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
