// Inputs that once crashed, hung or leaked a fuzz target (tests/fuzz), replayed through the same
// decoders: each must now be answered quickly with OK or a clean error. Inputs live in
// tests/data/fuzz/<target>/, one file each, named after what went wrong.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "libs/common/clock.h"
#include "libs/gossip/dpwa_config.h"
#include "libs/task/task_file.h"
#include "services/aggregator/aggregator_core.h"

namespace shoal {
namespace {

std::filesystem::path DataDir() {
  const char* root = std::getenv("SHOAL_SOURCE_DIR");
  return std::filesystem::path(root != nullptr ? root : ".") / "tests/data/fuzz";
}

std::vector<std::filesystem::path> Inputs(const std::string& target) {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path dir = DataDir() / target;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) out.push_back(entry.path());
  return out;
}

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Clean(absl::string_view message) {
  for (unsigned char c : message) {
    if (c < 0x20 || c == 0x7F) return false;
  }
  return true;
}

TEST(FuzzRegressionTest, TaskFilesAreAnsweredQuickly) {
  std::vector<std::filesystem::path> inputs = Inputs("task_json");
  for (const auto& p : Inputs("task_yaml")) inputs.push_back(p);
  ASSERT_FALSE(inputs.empty()) << "no inputs under " << DataDir();
  for (const auto& path : inputs) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<common::v1::TaskSpec> spec = task::ParseTaskSpec(Read(path), "fuzz.yaml");
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, std::chrono::seconds(5)) << path;
    EXPECT_TRUE(Clean(spec.status().message())) << path;
    if (!spec.ok()) continue;
    EXPECT_TRUE(Clean(task::ValidateTaskSpec(*spec).message())) << path;
    // What parses renders as JSON that parses back to the same spec (an unset enum once
    // rendered as "unspecified", which no task file may hold).
    const std::string json = task::MessageToFriendlyJson(*spec);
    absl::StatusOr<common::v1::TaskSpec> back = task::ParseTaskSpec(json, "back.json");
    ASSERT_TRUE(back.ok()) << path << ": " << back.status() << "\n" << json;
    EXPECT_EQ(back->SerializeAsString(), spec->SerializeAsString()) << path;
  }
}

TEST(FuzzRegressionTest, DpwaConfigsAreAnsweredQuickly) {
  for (const auto& path : Inputs("dpwa_config")) {
    absl::StatusOr<gossip::DpwaConfig> config = gossip::ParseDpwaConfig(Read(path), "fuzz.yaml");
    EXPECT_TRUE(Clean(config.status().message())) << path;
  }
}

// fuzz_aggregator_push: names from the network were quoted raw in the aggregator's errors.
TEST(FuzzRegressionTest, AggregatorErrorsEscapeNamesFromTheNetwork) {
  prometheus::Registry registry;
  aggregator::AggregatorMetrics metrics(registry);
  FakeClock clock;
  auto core = aggregator::AggregatorCore::Create({}, clock, metrics);
  ASSERT_TRUE(core.ok());
  absl::Status s = (*core)->CheckCaller("t", "peer\x1b[2J", "", "cert\x07");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Clean(s.message())) << s.message();
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("'peer\\x1b[2J'"));
  absl::Status open = (*core)->OpenRound({"task\x1b", 1, 0, {}, 0});
  EXPECT_TRUE(Clean(open.message())) << open.message();
}

}  // namespace
}  // namespace shoal
