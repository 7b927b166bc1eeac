// AggregatorWorkRunner: the rounds of a hierarchical task, run on its tree of aggregators (the
// root and one child per further cluster). Idempotent step by step, like the calls it makes: a
// failed open or close is asked again by the mode and repeats only what is needed (a child's
// repeated CloseRound sends the same partial sum, counted once by the root).

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "services/coordinator/aggregator_work.h"

namespace shoal::coordinator {
namespace {

absl::Status InCluster(const absl::Status& s, const AggregatorTree::Child& child) {
  return absl::Status(s.code(), absl::StrCat("cluster of aggregator ", child.address, " (child '",
                                             child.id, "'): ", s.message()));
}

}  // namespace

absl::Status AggregatorWorkRunner::OpenTree(const std::string& task, const AggregatorTree& tree,
                                            const aggregator::v1::OpenRoundRequest& open) {
  // Each expected peer pushes to its cluster's aggregator; one in no child's cluster to the root.
  aggregator::v1::OpenRoundRequest root = open;
  root.clear_expected_peers();
  std::vector<aggregator::v1::OpenRoundRequest> child_opens(tree.children.size(), open);
  for (aggregator::v1::OpenRoundRequest& c : child_opens) c.clear_expected_peers();
  for (const std::string& peer : open.expected_peers()) {
    bool placed = false;
    for (size_t i = 0; i < tree.children.size() && !placed; ++i) {
      if (tree.children[i].peers.count(peer) > 0) {
        child_opens[i].add_expected_peers(peer);
        placed = true;
      }
    }
    if (!placed) root.add_expected_peers(peer);
  }
  // Every child is named (so that each may fetch the root's versions); only those with peers in
  // the round open one and send a partial sum.
  std::vector<AggregatorTree::Child> in_round;
  for (size_t i = 0; i < tree.children.size(); ++i) {
    root.add_expected_children(tree.children[i].id);
    if (child_opens[i].expected_peers_size() > 0) in_round.push_back(tree.children[i]);
  }
  if (absl::Status s = client_.OpenRound(tree.root, root, clock_.Now() + options_.call_timeout);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < tree.children.size(); ++i) {
    aggregator::v1::OpenRoundRequest& c = child_opens[i];
    if (c.expected_peers_size() == 0) continue;
    c.mutable_parent()->set_address(tree.root);
    c.mutable_parent()->set_child(tree.children[i].id);
    // A child that does not hold the base version fetches it from the root first: a transfer.
    if (absl::Status s = client_.OpenRound(tree.children[i].address, c,
                                           clock_.Now() + options_.transfer_timeout);
        !s.ok()) {
      return InCluster(s, tree.children[i]);
    }
  }
  absl::MutexLock lock(&mu_);
  tree_rounds_[task] = {open.round(), std::move(in_round)};
  return absl::OkStatus();
}

absl::StatusOr<aggregator::v1::CloseRoundResponse> AggregatorWorkRunner::CloseTree(
    const std::string& task, const AggregatorTree& tree,
    const aggregator::v1::CloseRoundRequest& close) {
  std::vector<AggregatorTree::Child> in_round;
  {
    absl::MutexLock lock(&mu_);
    auto it = tree_rounds_.find(task);
    if (it != tree_rounds_.end() && it->second.first == close.round()) in_round = it->second.second;
  }
  // The children first: each sends the root its partial sum (a transfer) before the root closes.
  for (const AggregatorTree::Child& child : in_round) {
    absl::StatusOr<aggregator::v1::CloseRoundResponse> forwarded =
        client_.CloseRound(child.address, close, clock_.Now() + options_.transfer_timeout);
    if (!forwarded.ok()) return InCluster(forwarded.status(), child);
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> closed =
      client_.CloseRound(tree.root, close, clock_.Now() + options_.call_timeout);
  if (!closed.ok()) return closed.status();
  // Every cluster's peers evaluate the new version at their own aggregator: each child fetches
  // it from the root now (the root sends one model per child, not one per peer). A child that
  // cannot is only logged: it fetches the version with its next round, and a lost child moves
  // the task anyway.
  for (const AggregatorTree::Child& child : tree.children) {
    aggregator::v1::PullModelRequest pull;
    pull.set_task(task);
    pull.set_version(closed->version());
    pull.mutable_parent()->set_address(tree.root);
    pull.mutable_parent()->set_child(child.id);
    absl::StatusOr<bool> pulled =
        client_.PullModel(child.address, pull, clock_.Now() + options_.transfer_timeout);
    if (!pulled.ok()) {
      LogWarning("task ", task, ": ", InCluster(pulled.status(), child).message());
    }
  }
  return closed;
}

}  // namespace shoal::coordinator
