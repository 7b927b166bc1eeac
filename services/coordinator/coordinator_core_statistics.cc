#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/task/task_dataset.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/federation_statistics.h"

namespace shoal::coordinator {

absl::Status CoordinatorCore::RecordMoments(Task& task, const std::string& peer_id,
                                            const v1::DataMoments& report, Outbox& out) {
  const std::string& name = task.status.spec().name();
  if (!task::UsesFederationStatistics(task.status.spec().dataset())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data moments: task ", name, " does not standardise with the federation's statistics"));
  }
  if (!IsActive(task)) {
    return absl::FailedPreconditionError(absl::StrCat("task \"", name, "\" has ended"));
  }
  v1::CoordinatorEvent event;
  event.set_task(name);
  if (task.status.has_statistics()) {
    // Fixed before: this peer (a later one, or one that set up again) uses them as they are.
    *event.mutable_statistics() = task.status.statistics();
    SendTo(peer_id, std::move(event), out);
    return absl::OkStatus();
  }
  absl::StatusOr<data::FeatureMoments> moments = MomentsFromReport(task.status.spec(), report);
  if (!moments.ok()) return moments.status();
  for (const auto& [other, theirs] : task.moments) {
    if (other != peer_id && theirs.sum.size() != moments->sum.size()) {
      return absl::InvalidArgumentError(absl::StrCat("data moments: ", moments->sum.size(),
                                                     " features, but peer ", other, " has ",
                                                     theirs.sum.size()));
    }
  }
  task.moments[peer_id] = *std::move(moments);
  const size_t need = std::max<size_t>(1, task.status.spec().min_participants());
  if (task.moments.size() < need) {
    LogInfo("task ", name, ": data moments of ", task.moments.size(), " of ", need,
            " peers for the federation's statistics");
    return absl::OkStatus();
  }
  absl::StatusOr<common::v1::FederationStatistics> stats =
      AddUpStatistics(task.moments, clock_.Now());
  if (!stats.ok()) {
    task.moments.erase(peer_id);
    return stats.status();
  }
  *task.status.mutable_statistics() = *std::move(stats);
  task.moments.clear();
  LogInfo("task ", name, ": federation statistics fixed from ", task.status.statistics().samples(),
          " training samples of ", task.status.statistics().peers_size(), " peers");
  *event.mutable_statistics() = task.status.statistics();
  for (const std::string& id : task.peers) SendTo(id, event, out);
  MarkChanged(task, out);
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
