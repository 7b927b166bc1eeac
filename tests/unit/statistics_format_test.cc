// `task status` (text and JSON) shows the federation's statistics once they are fixed.

#include "services/shoalctl/statistics_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "services/shoalctl/task_format.h"

namespace shoal::shoalctl {
namespace {

using coordinator::v1::TaskStatus;
using ::testing::HasSubstr;

TEST(StatisticsFormatTest, FixedStatisticsShowInTextAndJson) {
  TaskStatus s;
  s.mutable_spec()->set_name("t");
  EXPECT_EQ(StatisticsToJson(s), "null");
  EXPECT_EQ(FormatStatisticsLine(s), "");
  EXPECT_TRUE(YAML::Load(TaskStatusToJson(s))["statistics"].IsNull());

  common::v1::FederationStatistics& f = *s.mutable_statistics();
  for (int i = 0; i < 10; ++i) {
    f.add_mean(1000.5 * i);
    f.add_std(0.25 + i);
  }
  f.set_samples(3000);
  f.add_peers("peer-0");
  f.add_peers("peer-1");
  f.set_fixed_unix_ms(1700000000000);
  EXPECT_EQ(FormatStatisticsLine(s),
            "statistics:    the federation's, of 3000 training samples of 2 peers\n"
            "  mean [0 1000 2001 3002 4002 5002 6003 7004 ... (10 features)]\n"
            "  std  [0.25 1.25 2.25 3.25 4.25 5.25 6.25 7.25 ... (10 features)]\n");
  EXPECT_THAT(FormatTaskStatus(s), HasSubstr("statistics:    the federation's, of 3000"));
  const YAML::Node json = YAML::Load(TaskStatusToJson(s))["statistics"];
  ASSERT_TRUE(json.IsMap());
  ASSERT_EQ(json["mean"].size(), 10u);
  EXPECT_DOUBLE_EQ(json["mean"][9].as<double>(), 9004.5);
  EXPECT_DOUBLE_EQ(json["std"][0].as<double>(), 0.25);
  EXPECT_EQ(json["samples"].as<int>(), 3000);
  EXPECT_EQ(json["peers"][1].as<std::string>(), "peer-1");
  EXPECT_EQ(json["fixed_unix_ms"].as<int64_t>(), 1700000000000);
}

}  // namespace
}  // namespace shoal::shoalctl
