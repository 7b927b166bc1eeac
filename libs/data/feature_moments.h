#pragma once

// Federation statistics (DatasetSpec normalization standardize): each peer's count, sums and
// sums of squares of its training features (a table's columns, an image's channels), added up
// into one mean and standard deviation per feature that every peer standardises with. Plain
// sums, so that secure aggregation can add them up without the coordinator seeing each peer's
// (libs/privacy/moments_codec.h encodes them for it). Torch-free and proto-free: the peer and the
// coordinator convert their messages.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/data/dataset.h"

namespace shoal::data {

// The moments of `count` samples' features: sum[j] and sum_squares[j] belong to feature j.
struct FeatureMoments {
  uint64_t count = 0;
  std::vector<double> sum;
  std::vector<double> sum_squares;
};

// Mean and population standard deviation per feature.
struct FeatureStatistics {
  std::vector<double> mean;
  std::vector<double> stddev;
};

// The moments of the samples `rows` of `data` (indices into it), per feature (FeatureCount():
// a table's columns, an image's channels), accumulated in double. An image's channel counts as
// one feature value per image: its sum and sum of squares are those of all its pixels divided by
// the pixels per image (ValuesPerFeature()), so that `count` is the number of images and
// StatisticsFromMoments gives the mean and standard deviation over every pixel. INVALID_ARGUMENT
// for no rows, a row out of range, values whose size does not match count * SampleSize(), or a
// value that is not finite.
absl::StatusOr<FeatureMoments> ComputeMoments(const Dataset& data,
                                              const std::vector<int64_t>& rows);

// Checks one peer's moments: count > 0, as many sums as sums of squares (at least one), every
// value finite, sums of squares >= 0. INVALID_ARGUMENT naming the field otherwise.
absl::Status CheckMoments(const FeatureMoments& moments);

// total += part. INVALID_ARGUMENT (total unchanged) when part fails CheckMoments or has another
// number of features than a non-empty total.
absl::Status AddMoments(FeatureMoments& total, const FeatureMoments& part);

// The mean and population standard deviation of every feature from added-up moments. A feature
// whose variance is 0 to double precision (a constant feature; sums of squares lose the last
// digits) gets standard deviation 1, so it maps to 0. INVALID_ARGUMENT when `moments` fail
// CheckMoments or a statistic is not a finite float.
absl::StatusOr<FeatureStatistics> StatisticsFromMoments(const FeatureMoments& moments);

}  // namespace shoal::data
