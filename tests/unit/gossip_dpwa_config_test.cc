// libs/gossip: dpwa's YAML configuration reader (its sample file unchanged, and errors).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "libs/gossip/dpwa_config.h"
#include "libs/task/task_file.h"

namespace shoal::gossip {
namespace {

using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("SHOAL_SOURCE_DIR");
  return dir ? dir : ".";
}

TEST(DpwaConfig, ReadsDpwasSampleUnchanged) {
  absl::StatusOr<DpwaConfig> c = LoadDpwaConfig(SourceDir() + "/tests/data/dpwa/sample.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->nodes.size(), 4u);
  EXPECT_EQ(c->nodes[0].name, "w1");
  EXPECT_EQ(c->nodes[0].host, "localhost");
  EXPECT_EQ(c->nodes[0].port, 45000);
  EXPECT_EQ(c->nodes[3].address(), "localhost:45003");
  ASSERT_NE(c->Find("w3"), nullptr);
  EXPECT_EQ(c->Find("w3")->port, 45002);
  EXPECT_EQ(c->Find("w9"), nullptr);
  EXPECT_DOUBLE_EQ(c->gossip.fetch_probability(), 1.0);
  EXPECT_EQ(c->gossip.timeout_ms(), 2500u);
  EXPECT_EQ(c->gossip.interpolation(), common::v1::INTERPOLATION_CONSTANT);
  EXPECT_DOUBLE_EQ(c->gossip.divergence_threshold(), 0.2);
  EXPECT_DOUBLE_EQ(c->gossip.constant_factor(), 0.5);
}

TEST(DpwaConfig, ReadsAMappingAndExtensions) {
  absl::StatusOr<DpwaConfig> c = ParseDpwaConfig(R"(
nodes:
  - {name: a, host: 127.0.0.1, port: 1}
  - {name: b, host: "::1", port: 2}
interpolation: loss
fetch_probability: 0.25
include_buffers: true
mix_post_step: true
flow_control: {failure_penalty: 50, random_max: 500}
)",
                                                 "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nodes[1].address(), "[::1]:2");
  EXPECT_EQ(c->gossip.interpolation(), common::v1::INTERPOLATION_LOSS);
  EXPECT_DOUBLE_EQ(c->gossip.fetch_probability(), 0.25);
  EXPECT_TRUE(c->gossip.include_buffers());
  EXPECT_TRUE(c->gossip.mix_post_step());
  EXPECT_DOUBLE_EQ(c->gossip.flow_control().failure_penalty(), 50);
  EXPECT_DOUBLE_EQ(c->gossip.flow_control().random_max(), 500);
  EXPECT_FALSE(c->gossip.has_timeout_ms());  // unset: the default applies later
}

TEST(DpwaConfig, ErrorsNameFileLineAndKey) {
  const std::string nodes = "- nodes:\n  - {name: a, host: h, port: 1}\n";
  struct Case {
    std::string text;
    std::string error;
  };
  const Case cases[] = {
      {"", "c.yaml: the dpwa config is empty"},
      {"- nodes: [\n", "c.yaml:"},
      {"- timeout_ms: 5\n", "c.yaml: nodes: required"},
      {"- nodes: []\n", "c.yaml:1: nodes: expected a non-empty list"},
      {"- nodes:\n  - {name: a, host: h}\n", "c.yaml:2: nodes[0]: port is required"},
      {"- nodes:\n  - {name: a, host: h, port: 70000}\n",
       "c.yaml:2: nodes[0].port: must be in 1..65535, got 70000"},
      {"- nodes:\n  - {name: a, host: h, port: 1}\n  - {name: a, host: h, port: 2}\n",
       "c.yaml:3: nodes[1]: duplicate node name \"a\""},
      {"- nodes:\n  - {name: a, host: h, port: 1, weight: 3}\n", "nodes[0].weight: unknown key"},
      {nodes + "- fetch_probability: 2\n", "c.yaml:3: fetch_probability: must be in [0, 1], got 2"},
      {nodes + "- fetch_probability: often\n", "c.yaml:3: fetch_probability: expected a number"},
      {nodes + "- timeout_ms: 0\n", "c.yaml:3: timeout_ms: must be in 1..600000, got 0"},
      {nodes + "- interpolation: median\n",
       "c.yaml:3: interpolation: unknown method \"median\" (expected constant, clock, loss)"},
      {nodes + "- divergence_threshold: -1\n", "c.yaml:3: divergence_threshold: must be >= 0"},
      {nodes + "- constant: {value: 3}\n", "c.yaml:3: constant.value: must be in [0, 1], got 3"},
      {nodes + "- constant: {factor: 0.5}\n", "constant.factor: unknown key (expected value)"},
      {nodes + "- timeout_ms: 10\n- timeout_ms: 20\n", "c.yaml:4: timeout_ms: set twice"},
      {nodes + "- batch_size: 3\n", "c.yaml:3: batch_size: unknown key"},
      {nodes + "- {timeout_ms: 1, fetch_probability: 1}\n",
       "c.yaml:3: item 2: expected a single-key map"},
      {nodes + "- flow_control: {min: 2000}\n", "c.yaml: flow_control.min: must be <= max"},
      {"42\n", "c.yaml:1: config: expected a list of single-key maps"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DpwaConfig> got = ParseDpwaConfig(c.text, "c.yaml");
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error)) << c.text;
  }
  EXPECT_EQ(LoadDpwaConfig("/nonexistent/dpwa.yaml").status().code(), absl::StatusCode::kNotFound);
}

// Gossip settings in task files: dpwa's defaults fill what is left out; errors name the field.
TEST(GossipTaskFile, DefaultsAndValidation) {
  absl::StatusOr<common::v1::TaskSpec> spec =
      task::ParseTaskSpec("name: g\nmode: gossip\ngossip: {fetch_probability: 0.2}\n", "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->gossip().fetch_probability(), 0.2);
  EXPECT_EQ(spec->gossip().timeout_ms(), 2500u);
  EXPECT_EQ(spec->gossip().interpolation(), common::v1::INTERPOLATION_CONSTANT);
  EXPECT_DOUBLE_EQ(spec->gossip().constant_factor(), 0.5);
  EXPECT_DOUBLE_EQ(spec->gossip().flow_control().failure_penalty(), 100);
  EXPECT_TRUE(task::ValidateTaskSpec(*spec).ok());
  // Other modes are left alone.
  spec = task::ParseTaskSpec("name: f\n", "t.yaml");
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->has_gossip());

  spec = task::ParseTaskSpec(
      "name: g\nmode: gossip\ngossip: {interpolation: loss, timeout_ms: 0}\n", "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->gossip().interpolation(), common::v1::INTERPOLATION_LOSS);
  absl::Status s = task::ValidateTaskSpec(*spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gossip.timeout_ms: must be in 1..600000"));

  absl::StatusOr<common::v1::TaskSpec> deployed =
      task::LoadTaskFile(SourceDir() + "/deploy/tasks/fashion-mnist-gossip.yaml");
  ASSERT_TRUE(deployed.ok()) << deployed.status();
  EXPECT_EQ(deployed->mode(), common::v1::MODE_GOSSIP);
  absl::StatusOr<common::v1::TaskSpec> dpwa_task =
      task::LoadTaskFile(SourceDir() + "/deploy/dpwa/task.yaml");
  ASSERT_TRUE(dpwa_task.ok()) << dpwa_task.status();
  absl::StatusOr<DpwaConfig> dpwa = LoadDpwaConfig(SourceDir() + "/deploy/dpwa/cluster.yaml");
  ASSERT_TRUE(dpwa.ok()) << dpwa.status();
  EXPECT_EQ(dpwa->nodes.size(), 4u);
}

}  // namespace
}  // namespace shoal::gossip
