#include "tests/unit/statistics_testing.h"

#include <utility>

namespace shoal::coordinator::statistics_testing {

common::v1::TaskSpec CsvStandardize(common::v1::TaskSpec spec) {
  common::v1::DatasetSpec& d = *spec.mutable_dataset();
  d.clear_name();
  d.set_format(common::v1::DATA_FORMAT_CSV);
  d.set_train("train.csv");
  d.set_label_column("y");
  d.set_num_classes(2);
  d.set_test_fraction(0.2);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  return spec;
}

data::FeatureMoments Moments(uint64_t count, std::vector<double> sum,
                             std::vector<double> sum_squares) {
  return data::FeatureMoments{count, std::move(sum), std::move(sum_squares)};
}

data::FeatureMoments MomentsOfA() { return Moments(2, {4, 20}, {10, 200}); }
data::FeatureMoments MomentsOfB() { return Moments(1, {8, 10}, {64, 100}); }

v1::PeerMessage PlainMoments(const std::string& task, const data::FeatureMoments& moments) {
  v1::PeerMessage m;
  m.set_task(task);
  m.mutable_data_moments()->set_count(moments.count);
  for (double v : moments.sum) m.mutable_data_moments()->add_sum(v);
  for (double v : moments.sum_squares) m.mutable_data_moments()->add_sum_squares(v);
  return m;
}

}  // namespace shoal::coordinator::statistics_testing
