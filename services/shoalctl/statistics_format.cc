#include "services/shoalctl/statistics_format.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/task/task_file.h"

namespace shoal::shoalctl {
namespace {

constexpr int kStatisticsShown = 8;

std::string JsonNumbers(const google::protobuf::RepeatedField<double>& values) {
  return absl::StrCat(
      "[",
      absl::StrJoin(values, ",",
                    [](std::string* out, double v) { out->append(task::JsonNumber(v)); }),
      "]");
}

std::string ShownNumbers(const google::protobuf::RepeatedField<double>& values) {
  std::vector<std::string> out;
  for (int i = 0; i < values.size() && i < kStatisticsShown; ++i) {
    out.push_back(absl::StrFormat("%.4g", values[i]));
  }
  if (values.size() > kStatisticsShown) {
    out.push_back(absl::StrCat("... (", values.size(), " features)"));
  }
  return absl::StrJoin(out, " ");
}

}  // namespace

std::string StatisticsToJson(const coordinator::v1::TaskStatus& status) {
  if (!status.has_statistics()) return "null";
  const common::v1::FederationStatistics& s = status.statistics();
  std::vector<std::string> peers;
  for (const std::string& p : s.peers()) peers.push_back(task::JsonQuote(p));
  return absl::StrCat("{\"mean\":", JsonNumbers(s.mean()), ",\"std\":", JsonNumbers(s.std()),
                      ",\"samples\":", s.samples(), ",\"peers\":[", absl::StrJoin(peers, ","),
                      "],\"fixed_unix_ms\":", s.fixed_unix_ms(), "}");
}

std::string FormatStatisticsLine(const coordinator::v1::TaskStatus& status) {
  if (!status.has_statistics()) return "";
  const common::v1::FederationStatistics& s = status.statistics();
  return absl::StrCat("statistics:    the federation's, of ", s.samples(), " training samples of ",
                      s.peers_size(), " peers\n  mean [", ShownNumbers(s.mean()), "]\n  std  [",
                      ShownNumbers(s.std()), "]\n");
}

}  // namespace shoal::shoalctl
