#include "services/aggregator/sessions/partial_sums.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal::aggregator {
namespace {

std::string ChildLabel(const PartialMeta& meta) {
  return absl::StrCat("child '", EscapeBytes(meta.child), "'");
}

}  // namespace

absl::StatusOr<TreePartials> TreePartials::Make(const OpenRoundParams& p,
                                                const std::set<std::string>& expected,
                                                const std::set<std::string>& late,
                                                const std::string& label) {
  TreePartials tree;
  tree.children_.insert(p.expected_children.begin(), p.expected_children.end());
  for (const std::string& id : tree.children_) {
    if (expected.count(id) > 0 || late.count(id) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", EscapeBytes(id), "' is both a peer and a child supernode in ", label));
    }
  }
  for (const auto& [child, backup] : p.child_backups) {
    if (tree.children_.count(child) == 0 || backup.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": child_backups names '", EscapeBytes(child), "' (backup '", EscapeBytes(backup),
          "'), which is not an expected child or has no backup id"));
    }
  }
  tree.child_backups_ = p.child_backups;
  tree.parent_ = p.parent;
  return tree;
}

absl::StatusOr<std::set<std::string>> TreePartials::CheckSum(
    const PartialMeta& meta, const aggregation::PartialSum& partial) {
  const std::string label = RoundLabel(meta.round, meta.task);
  const std::string child = ChildLabel(meta);
  if (meta.contributors.size() != partial.count) {
    return absl::InvalidArgumentError(absl::StrCat(child, " names ", meta.contributors.size(),
                                                   " contributors for a sum of ", partial.count,
                                                   " updates in ", label));
  }
  if (!std::isfinite(meta.loss_sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(child, "'s loss sum in ", label, " is not finite"));
  }
  if (meta.num_samples < meta.contributors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(child, " counts ", meta.num_samples,
                                                   " samples for ", meta.contributors.size(),
                                                   " contributors in ", label));
  }
  std::set<std::string> contributors(meta.contributors.begin(), meta.contributors.end());
  if (contributors.size() != meta.contributors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(child, " names a contributor twice in ", label));
  }
  return contributors;
}

absl::StatusOr<bool> TreePartials::Admit(const PartialMeta& meta,
                                         const std::set<std::string>& contributors,
                                         const Round& round) {
  const std::string label = RoundLabel(meta.round, meta.task);
  const std::string child = ChildLabel(meta);
  if (round.number == meta.round && children_in_.count(meta.child) > 0) {
    return true;  // a repeat of an accepted partial
  }
  if (round.number != meta.round || !round.open) {
    return absl::FailedPreconditionError(absl::StrCat(label, " is not open"));
  }
  if (children_.count(meta.child) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(child, " is not expected in ", label));
  }
  if (meta.base_version != round.base_version) {
    return absl::FailedPreconditionError(absl::StrCat(child, " summed updates of version ",
                                                      meta.base_version, " but ", label,
                                                      " folds into version ", round.base_version));
  }
  for (const std::string& peer : contributors) {
    if (round.has_peer(peer)) {
      return absl::FailedPreconditionError(absl::StrCat(
          child, "'s contributor '", EscapeBytes(peer), "' is a peer of ", label, " already"));
    }
  }
  children_in_.insert(meta.child);
  return false;
}

absl::Status TreePartials::Refuse(const PartialMeta& meta, const absl::Status& added) {
  children_in_.erase(meta.child);
  const auto code = added.code() == absl::StatusCode::kFailedPrecondition
                        ? absl::StatusCode::kFailedPrecondition
                        : absl::StatusCode::kInvalidArgument;
  return absl::Status(code, absl::StrCat(ChildLabel(meta), "'s partial sum for ",
                                         RoundLabel(meta.round, meta.task), ": ", added.message()));
}

void TreePartials::Register(TaskState& task) const {
  task.children.insert(children_.begin(), children_.end());
  for (const auto& [child, backup] : child_backups_) task.child_backups[child].insert(backup);
}

void TreePartials::Renew(TaskState& task, const TreePartials& request) {
  children_ = request.children_;
  parent_ = request.parent_;
  request.Register(task);
}

std::shared_ptr<const PartialResult> TreePartials::Finish(const std::string& task, uint64_t round,
                                                          uint64_t base_version,
                                                          const std::set<std::string>& contributors,
                                                          uint64_t num_samples, double loss_sum,
                                                          aggregation::PartialSum sum) {
  auto result = std::make_shared<PartialResult>();
  result->meta.task = task;
  result->meta.round = round;
  result->meta.base_version = base_version;
  result->meta.contributors.assign(contributors.begin(), contributors.end());
  result->meta.num_samples = num_samples;
  result->meta.loss_sum = loss_sum;
  result->sum = std::move(sum);
  made_ = result;
  return made_;
}

}  // namespace shoal::aggregator
