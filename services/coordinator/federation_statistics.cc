#include "services/coordinator/federation_statistics.h"

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

absl::StatusOr<data::FeatureMoments> MomentsFromReport(const common::v1::TaskSpec& spec,
                                                       const v1::DataMoments& report) {
  if (report.sum_size() > kMaxMomentFeatures) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data moments: ", report.sum_size(), " features, over the limit of ", kMaxMomentFeatures));
  }
  data::FeatureMoments m;
  m.count = report.count();
  m.sum.assign(report.sum().begin(), report.sum().end());
  m.sum_squares.assign(report.sum_squares().begin(), report.sum_squares().end());
  if (absl::Status s = data::CheckMoments(m); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("data ", s.message()));
  }
  if (spec.dataset().format() == common::v1::DATA_FORMAT_IMAGE_FOLDER &&
      report.sum_size() != static_cast<int>(spec.dataset().channels())) {
    return absl::InvalidArgumentError(absl::StrCat("data moments: ", report.sum_size(),
                                                   " features, but the task's dataset.channels is ",
                                                   spec.dataset().channels()));
  }
  const int columns = spec.dataset().feature_columns_size();
  if (columns > 0 && report.sum_size() != columns) {
    return absl::InvalidArgumentError(absl::StrCat("data moments: ", report.sum_size(),
                                                   " features, but the task's "
                                                   "dataset.feature_columns names ",
                                                   columns));
  }
  return m;
}

absl::StatusOr<common::v1::FederationStatistics> AddUpStatistics(
    const std::map<std::string, data::FeatureMoments>& by_peer, absl::Time now) {
  data::FeatureMoments total;
  std::vector<std::string> peers;
  for (const auto& [peer, moments] : by_peer) {
    if (absl::Status s = data::AddMoments(total, moments); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("peer ", peer, ": ", s.message()));
    }
    peers.push_back(peer);
  }
  return StatisticsOfTotal(total, peers, now);
}

absl::StatusOr<common::v1::FederationStatistics> StatisticsOfTotal(
    const data::FeatureMoments& total, const std::vector<std::string>& peers, absl::Time now) {
  absl::StatusOr<data::FeatureStatistics> stats = data::StatisticsFromMoments(total);
  if (!stats.ok()) return stats.status();
  common::v1::FederationStatistics out;
  for (const std::string& peer : peers) out.add_peers(peer);
  for (double m : stats->mean) out.add_mean(m);
  for (double s : stats->stddev) out.add_std(s);
  out.set_samples(total.count);
  out.set_fixed_unix_ms(absl::ToUnixMillis(now));
  return out;
}

}  // namespace shoal::coordinator
