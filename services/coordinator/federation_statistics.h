#pragma once

// TaskStatus.statistics: the federation's statistics of a task whose peers standardise with
// them (normalization standardize without the task's mean/std), added up from the peers'
// DataMoments. Pure functions; CoordinatorCore keeps the moments of the task's present peers
// until the statistics are fixed, and holds its lock.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/data/feature_moments.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// At most this many features in one peer's moments (what a CSV row of a task may hold).
inline constexpr int kMaxMomentFeatures = 1 << 20;

// One peer's moments as reported. INVALID_ARGUMENT "data moments: ..." when they are malformed
// (no samples, sums and sums of squares of different lengths, values that are not finite) or
// their number of features differs from the task's feature_columns, when it names them, or from
// an image folder's channels.
absl::StatusOr<data::FeatureMoments> MomentsFromReport(const common::v1::TaskSpec& spec,
                                                       const v1::DataMoments& report);

// The statistics of every peer's moments added up: mean and population standard deviation per
// feature, the samples, the peers (the map's order: by peer id) and `now`. INVALID_ARGUMENT when
// the peers' numbers of features differ or a statistic is not a finite float.
absl::StatusOr<common::v1::FederationStatistics> AddUpStatistics(
    const std::map<std::string, data::FeatureMoments>& by_peer, absl::Time now);

// The statistics of moments already added up (the secure sum) of `peers`, ascending.
// INVALID_ARGUMENT as AddUpStatistics.
absl::StatusOr<common::v1::FederationStatistics> StatisticsOfTotal(
    const data::FeatureMoments& total, const std::vector<std::string>& peers, absl::Time now);

}  // namespace shoal::coordinator
