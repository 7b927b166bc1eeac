// deploy/grafana/shoal-dashboard.json is a valid Grafana dashboard whose queries use only metric
// names the services export (read from every services/**/*_metrics.cc at test time).

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace shoal::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

std::string SourceDir() {
  const char* dir = std::getenv("SHOAL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':';
}

// Every identifier starting with "shoal_" in `text`; with `quoted`, only those written as a
// string literal ("shoal_...").
std::vector<std::string> ShoalNames(const std::string& text, bool quoted) {
  std::vector<std::string> names;
  const std::string prefix = quoted ? "\"shoal_" : "shoal_";
  for (size_t pos = text.find(prefix); pos != std::string::npos; pos = text.find(prefix, pos + 1)) {
    const size_t start = quoted ? pos + 1 : pos;
    if (!quoted && start > 0 && IsNameChar(text[start - 1])) continue;
    size_t end = start;
    while (end < text.size() && IsNameChar(text[end])) ++end;
    if (quoted && (end >= text.size() || text[end] != '"')) continue;
    names.push_back(text.substr(start, end - start));
  }
  return names;
}

// The metric names the services register (every services/**/*_metrics.cc, mode folders included),
// plus the series Prometheus derives from histograms (accepted for every name: a typo still fails).
std::set<std::string> ExportedMetrics() {
  std::set<std::string> names;
  std::vector<std::string> files;
  for (const auto& file :
       std::filesystem::recursive_directory_iterator(SourceDir() + "/services")) {
    if (file.is_regular_file() && absl::EndsWith(file.path().filename().string(), "_metrics.cc")) {
      files.push_back(file.path().string());
    }
  }
  EXPECT_GE(files.size(), 3u) << "no *_metrics.cc found under " << SourceDir() << "/services";
  for (const std::string& file : files) {
    for (const std::string& name : ShoalNames(ReadFile(file), true)) {
      names.insert(name);
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(name + suffix);
    }
  }
  return names;
}

struct Dashboard {
  Struct root;
  std::vector<const Struct*> panels;  // flattened: rows' nested panels included
};

void CollectPanels(const Value& list, std::vector<const Struct*>& out) {
  for (const Value& panel : list.list_value().values()) {
    out.push_back(&panel.struct_value());
    auto nested = panel.struct_value().fields().find("panels");
    if (nested != panel.struct_value().fields().end()) CollectPanels(nested->second, out);
  }
}

const Value* Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

std::string StringField(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->kind_case() == Value::kStringValue ? v->string_value() : "";
}

class GrafanaDashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string json = ReadFile(SourceDir() + "/deploy/grafana/shoal-dashboard.json");
    ASSERT_FALSE(json.empty());
    auto status = google::protobuf::util::JsonStringToMessage(json, &dashboard_.root);
    ASSERT_TRUE(status.ok()) << "shoal-dashboard.json is not valid JSON: " << status.ToString();
    const Value* panels = Field(dashboard_.root, "panels");
    ASSERT_NE(panels, nullptr) << "no panels";
    ASSERT_EQ(panels->kind_case(), Value::kListValue) << "panels is not a list";
    CollectPanels(*panels, dashboard_.panels);
    metrics_ = ExportedMetrics();
  }

  Dashboard dashboard_;
  std::set<std::string> metrics_;
};

TEST(ShoalNamesTest, FindsNamesInExpressions) {
  EXPECT_EQ(ShoalNames("sum by (le) (rate(shoal_a_b_bucket[5m])) / x_shoal_no + shoal_c", false),
            (std::vector<std::string>{"shoal_a_b_bucket", "shoal_c"}));
  EXPECT_EQ(ShoalNames(R"(.Name("shoal_x_total") "shoal_y "shoal_z")", true),
            (std::vector<std::string>{"shoal_x_total", "shoal_z"}));
}

TEST_F(GrafanaDashboardTest, MetricNamesComeFromTheSources) {
  // Guards the extraction itself: a broken scan would make the next test vacuous.
  EXPECT_GE(metrics_.size(), 30u);
  for (const char* name :
       {"shoal_coordinator_rounds_completed_total", "shoal_aggregator_updates_rejected_total",
        "shoal_peer_train_loss", "shoal_aggregator_round_duration_seconds_bucket",
        "shoal_peer_gossip_fetches_started_total"}) {
    EXPECT_TRUE(metrics_.count(name)) << name;
  }
}

TEST_F(GrafanaDashboardTest, IsAGrafanaDashboard) {
  EXPECT_FALSE(StringField(dashboard_.root, "title").empty());
  EXPECT_FALSE(StringField(dashboard_.root, "uid").empty());
  const Value* schema = Field(dashboard_.root, "schemaVersion");
  ASSERT_NE(schema, nullptr);
  EXPECT_GE(schema->number_value(), 30);

  // A Prometheus data source variable that every panel and query uses.
  const Value* templating = Field(dashboard_.root, "templating");
  ASSERT_NE(templating, nullptr);
  const Value* list = Field(templating->struct_value(), "list");
  ASSERT_NE(list, nullptr);
  bool has_variable = false;
  for (const Value& v : list->list_value().values()) {
    has_variable |= StringField(v.struct_value(), "name") == "datasource" &&
                    StringField(v.struct_value(), "type") == "datasource" &&
                    StringField(v.struct_value(), "query") == "prometheus";
  }
  EXPECT_TRUE(has_variable) << "no Prometheus data source variable named \"datasource\"";

  std::set<double> ids;
  int queries = 0;
  for (const Struct* panel : dashboard_.panels) {
    const std::string title = StringField(*panel, "title");
    EXPECT_FALSE(title.empty()) << "a panel without a title";
    const Value* id = Field(*panel, "id");
    ASSERT_NE(id, nullptr) << title;
    EXPECT_TRUE(ids.insert(id->number_value()).second) << "duplicate panel id in " << title;
    const Value* grid = Field(*panel, "gridPos");
    ASSERT_NE(grid, nullptr) << title;
    for (const char* key : {"h", "w", "x", "y"}) {
      EXPECT_NE(Field(grid->struct_value(), key), nullptr) << title << " gridPos." << key;
    }
    const double x = Field(grid->struct_value(), "x")->number_value();
    const double w = Field(grid->struct_value(), "w")->number_value();
    EXPECT_LE(x + w, 24) << title << " is wider than the dashboard";
    if (StringField(*panel, "type") == "row") continue;

    const Value* datasource = Field(*panel, "datasource");
    ASSERT_NE(datasource, nullptr) << title;
    EXPECT_EQ(StringField(datasource->struct_value(), "uid"), "${datasource}") << title;
    const Value* targets = Field(*panel, "targets");
    ASSERT_NE(targets, nullptr) << title << " has no queries";
    EXPECT_GT(targets->list_value().values_size(), 0) << title << " has no queries";
    std::set<std::string> ref_ids;
    for (const Value& target : targets->list_value().values()) {
      const std::string expr = StringField(target.struct_value(), "expr");
      EXPECT_FALSE(expr.empty()) << title;
      EXPECT_TRUE(ref_ids.insert(StringField(target.struct_value(), "refId")).second)
          << "duplicate refId in " << title;
      ++queries;
    }
  }
  EXPECT_GE(queries, 10);
}

TEST_F(GrafanaDashboardTest, EveryQueryUsesExportedMetrics) {
  std::set<std::string> used;
  for (const Struct* panel : dashboard_.panels) {
    const Value* targets = Field(*panel, "targets");
    if (targets == nullptr) continue;
    for (const Value& target : targets->list_value().values()) {
      const std::string expr = StringField(target.struct_value(), "expr");
      for (const std::string& name : ShoalNames(expr, false)) {
        EXPECT_TRUE(metrics_.count(name))
            << "panel \"" << StringField(*panel, "title") << "\": " << name
            << " is not exported by any service (expr: " << expr << ")";
        used.insert(name);
      }
    }
  }
  // What the dashboard is for: rounds, round latency, accuracy, loss, bytes in/out, rejected
  // updates, peers and tasks.
  for (const char* name :
       {"shoal_coordinator_rounds_completed_total",
        "shoal_coordinator_round_duration_seconds_bucket",
        "shoal_aggregator_round_duration_seconds_bucket", "shoal_coordinator_test_accuracy_ratio",
        "shoal_coordinator_train_loss", "shoal_aggregator_bytes_received_total",
        "shoal_aggregator_bytes_sent_total", "shoal_aggregator_updates_rejected_total",
        "shoal_coordinator_peers_connected", "shoal_coordinator_tasks"}) {
    EXPECT_TRUE(used.count(name)) << "the dashboard does not show " << name;
  }
}

}  // namespace
}  // namespace shoal::testing
