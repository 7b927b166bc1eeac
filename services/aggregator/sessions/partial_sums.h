#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/aggregation/weighted_mean.h"
#include "services/aggregator/core_types.h"
#include "services/aggregator/sessions/session.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// The tree side of one federated-sync round: on a parent, the child supernodes whose partial
// sums it expects and which of them it took (one sum each); on a child, the parent its own
// partial sum goes to and, once ClosePartial made it, that sum. The round (RoundSession) owns one
// and keeps the peers, the samples and the aggregation the sums go into; this class decides
// whether a sum may enter and what a refused one is answered. Not thread-safe: the round calls
// it under its host's mu().
class TreePartials {
 public:
  // What a child's partial sum enters: the round as it stands.
  struct Round {
    uint64_t number = 0;
    bool open = false;  // open, and still its task's session
    uint64_t base_version = 0;
    std::function<bool(const std::string&)> has_peer;  // a peer of the round already
  };

  TreePartials() = default;
  // Checks the request's children against its peers and its child_backups against its children
  // (INVALID_ARGUMENT naming the id, in `label`).
  static absl::StatusOr<TreePartials> Make(const OpenRoundParams& params,
                                           const std::set<std::string>& expected,
                                           const std::set<std::string>& late,
                                           const std::string& label);

  // A child's partial sum, checked on what it says of itself (no round needed): INVALID_ARGUMENT
  // naming the child when its contributors, samples and loss do not add up. Its contributors.
  static absl::StatusOr<std::set<std::string>> CheckSum(const PartialMeta& meta,
                                                        const aggregation::PartialSum& partial);
  // Whether `meta`'s sum of `contributors` may enter `round`: true for a repeat of a sum taken;
  // false when it may (the child then counts as in; Refuse undoes that when the sum itself is
  // refused); FAILED_PRECONDITION when the round is not open, the child not expected, the base
  // version another or a contributor a peer of the round already.
  absl::StatusOr<bool> Admit(const PartialMeta& meta, const std::set<std::string>& contributors,
                             const Round& round);
  // The admitted sum did not add (`added`): the child is out again. The error for the child:
  // FAILED_PRECONDITION when `added` is one, else INVALID_ARGUMENT.
  absl::Status Refuse(const PartialMeta& meta, const absl::Status& added);

  // The task's children and their backups may read its models.
  void Register(TaskState& task) const;
  // A re-open: the request's children and parent (and their backups registered with `task`).
  void Renew(TaskState& task, const TreePartials& request);
  // A made partial sum goes to `request`'s parent (the root's backup took over).
  void Reparent(const TreePartials& request) { parent_ = request.parent_; }

  // A child's round: where its partial sum goes (empty address: it is no child's round).
  const v1::ParentRound& parent() const { return parent_; }
  bool child_round() const { return !parent_.address().empty(); }
  // The partial sum ClosePartial made (null: none yet).
  const std::shared_ptr<const PartialResult>& made() const { return made_; }
  // Makes the round's partial sum: the round's figures and `sum`, kept as made().
  std::shared_ptr<const PartialResult> Finish(const std::string& task, uint64_t round,
                                              uint64_t base_version,
                                              const std::set<std::string>& contributors,
                                              uint64_t num_samples, double loss_sum,
                                              aggregation::PartialSum sum);

 private:
  std::set<std::string> children_;     // child supernodes expected
  std::set<std::string> children_in_;  // children whose partial sums were taken
  std::vector<std::pair<std::string, std::string>> child_backups_;
  v1::ParentRound parent_;
  std::shared_ptr<const PartialResult> made_;
};

}  // namespace shoal::aggregator
