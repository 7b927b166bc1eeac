// AggregatorWorkRunner: the rounds of a hierarchical task, run on its tree of aggregators (the
// root, and one node per cluster below it, at any depth). Idempotent step by step, like the
// calls it makes: a failed open or close is asked again by the mode and repeats only what is
// needed (a node's repeated CloseRound sends the same partial sum, counted once by its parent).

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "services/coordinator/aggregator_work.h"

namespace shoal::coordinator {
namespace {

using Node = AggregatorTree::Node;

absl::Status AtNode(const absl::Status& s, const Node& node) {
  return absl::Status(s.code(), absl::StrCat("cluster of aggregator ", node.address, " (child '",
                                             node.id, "'): ", s.message()));
}

}  // namespace

absl::Status AggregatorWorkRunner::OpenTree(const std::string& task, const AggregatorTree& tree,
                                            const aggregator::v1::OpenRoundRequest& open) {
  const size_t n = tree.nodes.size();
  std::vector<aggregator::v1::OpenRoundRequest> opens(n, open);
  for (aggregator::v1::OpenRoundRequest& o : opens) o.clear_expected_peers();
  // Each expected peer pushes to its cluster's aggregator; one in no cluster to the root.
  for (const std::string& peer : open.expected_peers()) {
    size_t at = 0;
    for (size_t i = 1; i < n && at == 0; ++i) {
      if (tree.nodes[i].peers.count(peer) > 0) at = i;
    }
    opens[at].add_expected_peers(peer);
  }
  // A node takes part when peers of the round are in its cluster or below it. Every child is
  // named to its parent (so that each may fetch its parent's versions), whether or not it takes
  // part; those that do send their parent a partial sum.
  std::vector<bool> active(n, false);
  active[0] = true;
  for (size_t i = n; i-- > 1;) {
    if (opens[i].expected_peers_size() > 0) active[i] = true;
    if (active[i]) active[tree.nodes[i].parent] = true;
  }
  for (size_t i = 1; i < n; ++i) {
    const Node& node = tree.nodes[i];
    opens[node.parent].add_expected_children(node.id);
    opens[i].mutable_parent()->set_address(tree.nodes[node.parent].address);
    opens[i].mutable_parent()->set_child(node.id);
  }
  // From the root down: a node that does not hold the base version fetches it from its parent
  // (a transfer), which has it by then.
  std::vector<Node> in_round;
  for (size_t i = 0; i < n; ++i) {
    if (!active[i]) continue;
    const absl::Duration limit = i == 0 ? options_.call_timeout : options_.transfer_timeout;
    absl::Status s = client_.OpenRound(tree.nodes[i].address, opens[i], clock_.Now() + limit);
    if (!s.ok()) return i == 0 ? s : AtNode(s, tree.nodes[i]);
    if (i > 0) in_round.push_back(tree.nodes[i]);
  }
  absl::MutexLock lock(&mu_);
  tree_rounds_[task] = {open.round(), std::move(in_round)};
  return absl::OkStatus();
}

absl::StatusOr<aggregator::v1::CloseRoundResponse> AggregatorWorkRunner::CloseTree(
    const std::string& task, const AggregatorTree& tree,
    const aggregator::v1::CloseRoundRequest& close) {
  std::vector<Node> in_round;
  {
    absl::MutexLock lock(&mu_);
    auto it = tree_rounds_.find(task);
    if (it != tree_rounds_.end() && it->second.first == close.round()) in_round = it->second.second;
  }
  // The deepest first: each sends its parent its partial sum (a transfer) before the parent
  // closes and sends its own, which includes it.
  for (auto node = in_round.rbegin(); node != in_round.rend(); ++node) {
    absl::StatusOr<aggregator::v1::CloseRoundResponse> forwarded =
        client_.CloseRound(node->address, close, clock_.Now() + options_.transfer_timeout);
    if (!forwarded.ok()) return AtNode(forwarded.status(), *node);
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> closed =
      client_.CloseRound(tree.root(), close, clock_.Now() + options_.call_timeout);
  if (!closed.ok()) return closed.status();
  // Every cluster's peers evaluate the new version at their own aggregator: each node fetches
  // it from its parent, from the top down (each aggregator sends one model per child, not one
  // per peer). A node that cannot is only logged: it fetches the version with its next round,
  // and a lost node moves the task anyway.
  for (size_t i = 1; i < tree.nodes.size(); ++i) {
    const Node& node = tree.nodes[i];
    aggregator::v1::PullModelRequest pull;
    pull.set_task(task);
    pull.set_version(closed->version());
    pull.mutable_parent()->set_address(tree.nodes[node.parent].address);
    pull.mutable_parent()->set_child(node.id);
    absl::StatusOr<bool> pulled =
        client_.PullModel(node.address, pull, clock_.Now() + options_.transfer_timeout);
    if (!pulled.ok()) LogWarning("task ", task, ": ", AtNode(pulled.status(), node).message());
  }
  return closed;
}

}  // namespace shoal::coordinator
