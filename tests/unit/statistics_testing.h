#pragma once

// What the federation statistics' tests share (coordinator_statistics_test, plain moments;
// coordinator_secure_statistics_test, masked ones): a CSV task that standardises with the
// federation's statistics, and the moments of peers a and b.

#include <cstdint>
#include <string>
#include <vector>

#include "libs/data/feature_moments.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator::statistics_testing {

// `spec` (e.g. core_testing::Spec) reading a CSV table, train.csv with label y of 2 classes,
// standardised with the federation's statistics (normalization standardize, no mean/std).
common::v1::TaskSpec CsvStandardize(common::v1::TaskSpec spec);

data::FeatureMoments Moments(uint64_t count, std::vector<double> sum,
                             std::vector<double> sum_squares);
// a holds feature 0 = {1, 3} and b {8}; feature 1 is 10 everywhere (constant: std 1). Pooled:
// mean {4, 10}, std {sqrt(26/3), 1}, 3 samples.
data::FeatureMoments MomentsOfA();
data::FeatureMoments MomentsOfB();

// `moments` sent in the clear for `task`.
v1::PeerMessage PlainMoments(const std::string& task, const data::FeatureMoments& moments);

}  // namespace shoal::coordinator::statistics_testing
