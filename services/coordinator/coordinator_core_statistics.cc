#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/common/log.h"
#include "libs/task/task_dataset.h"
#include "libs/task/task_privacy.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/federation_statistics.h"

namespace shoal::coordinator {
namespace {

// How long the participants of a secure statistics' masking have to answer a step: the task's
// round_deadline_seconds, which bounds each step of a decentralized round too, at most 2 minutes
// (answering takes milliseconds; a masking that drops a participant must start again well within
// the 10 minutes the peers wait for the statistics).
absl::Duration StatisticsStepTimeout(const common::v1::TaskSpec& spec) {
  return absl::Seconds(std::clamp<uint32_t>(spec.round_deadline_seconds(), 1, 120));
}

}  // namespace

absl::Status CoordinatorCore::RecordMoments(Task& task, const std::string& peer_id,
                                            const v1::DataMoments& report, Outbox& out) {
  const common::v1::TaskSpec& spec = task.status.spec();
  const std::string& name = spec.name();
  if (!task::UsesFederationStatistics(spec.dataset())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data moments: task ", name, " does not standardise with the federation's statistics"));
  }
  if (!IsActive(task)) {
    return absl::FailedPreconditionError(absl::StrCat("task \"", name, "\" has ended"));
  }
  if (task.status.has_statistics()) {
    // Fixed before: this peer (a later one, or one that set up again) uses them as they are.
    v1::CoordinatorEvent event;
    event.set_task(name);
    *event.mutable_statistics() = task.status.statistics();
    SendTo(peer_id, std::move(event), out);
    return absl::OkStatus();
  }
  if (task::HasSecureAggregation(spec)) return RecordSecureMoments(task, peer_id, report, out);
  if (report.has_secure()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data moments: task ", name, " has no secure aggregation; send the plain moments"));
  }
  absl::StatusOr<data::FeatureMoments> moments = MomentsFromReport(spec, report);
  if (!moments.ok()) return moments.status();
  for (const auto& [other, theirs] : task.moments) {
    if (other != peer_id && theirs.sum.size() != moments->sum.size()) {
      return absl::InvalidArgumentError(absl::StrCat("data moments: ", moments->sum.size(),
                                                     " features, but peer ", other, " has ",
                                                     theirs.sum.size()));
    }
  }
  task.moments[peer_id] = *std::move(moments);
  const size_t need = std::max<size_t>(1, spec.min_participants());
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
  task.moments.clear();
  FixStatistics(task, *std::move(stats), out);
  return absl::OkStatus();
}

absl::Status CoordinatorCore::RecordSecureMoments(Task& task, const std::string& peer_id,
                                                  const v1::DataMoments& report, Outbox& out) {
  const common::v1::TaskSpec& spec = task.status.spec();
  if (!report.has_secure() || report.count() != 0 || report.sum_size() != 0 ||
      report.sum_squares_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data moments: task ", spec.name(),
        " has secure aggregation: the moments must come masked (DataMoments.secure) only"));
  }
  if (task.secure_moments == nullptr) {
    size_t features = static_cast<size_t>(spec.dataset().feature_columns_size());
    if (spec.dataset().format() == common::v1::DATA_FORMAT_IMAGE_FOLDER) {
      features = spec.dataset().channels();
    }
    task.secure_moments = std::make_unique<SecureStatistics>(spec.name(), spec.min_participants(),
                                                             task::StatisticsFeatureBound(spec),
                                                             features, StatisticsStepTimeout(spec));
  }
  auto peer = peers_.find(peer_id);
  const std::string identity =
      peer == peers_.end() ? std::string() : peer->second.hello.identity_public_key();
  SecureStatistics::Effects fx;
  if (absl::Status s =
          task.secure_moments->Receive(peer_id, identity, report.secure(), clock_.Now(), fx);
      !s.ok()) {
    return s;
  }
  SendSecureSteps(task, fx, out);
  if (!fx.total.has_value()) return absl::OkStatus();
  absl::StatusOr<common::v1::FederationStatistics> stats =
      StatisticsOfTotal(*fx.total, fx.peers, clock_.Now());
  if (!stats.ok()) return stats.status();
  task.secure_moments.reset();
  FixStatistics(task, *std::move(stats), out);
  return absl::OkStatus();
}

void CoordinatorCore::ExpireSecureSteps(Task& task, absl::Time now, Outbox& out) {
  if (task.secure_moments == nullptr) return;
  SecureStatistics::Effects fx;
  task.secure_moments->Expire(now, fx);
  if (!fx.dropped.empty()) {
    metrics_.statistics_dropped.Increment(static_cast<double>(fx.dropped.size()));
  }
  SendSecureSteps(task, fx, out);
}

void CoordinatorCore::SendSecureSteps(const Task& task, SecureStatistics::Effects& fx,
                                      Outbox& out) {
  for (auto& [peer, step] : fx.sends) {
    v1::CoordinatorEvent event;
    event.set_task(task.status.spec().name());
    *event.mutable_secure_statistics() = std::move(step);
    SendTo(peer, std::move(event), out);
  }
}

void CoordinatorCore::FixStatistics(Task& task, common::v1::FederationStatistics stats,
                                    Outbox& out) {
  *task.status.mutable_statistics() = std::move(stats);
  LogInfo("task ", task.status.spec().name(), ": federation statistics fixed from ",
          task.status.statistics().samples(), " training samples of ",
          task.status.statistics().peers_size(), " peers");
  v1::CoordinatorEvent event;
  event.set_task(task.status.spec().name());
  *event.mutable_statistics() = task.status.statistics();
  for (const std::string& id : task.peers) SendTo(id, event, out);
  MarkChanged(task, out);
}

}  // namespace shoal::coordinator
