// The training modes' definitions (libs/task/task_mode.h): every value of the Mode enum but
// UNSPECIFIED has exactly one, and task-file validation does what each definition says.

#include "libs/task/task_mode.h"

#include <google/protobuf/descriptor.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/task/task_file.h"

namespace shoal::task {
namespace {

using common::v1::TaskSpec;
using ::testing::HasSubstr;

absl::StatusOr<TaskSpec> ParseAndValidate(const std::string& text) {
  absl::StatusOr<TaskSpec> spec = ParseTaskSpec(text, "task.yaml");
  if (!spec.ok()) return spec.status();
  absl::Status valid = ValidateTaskSpec(*spec);
  if (!valid.ok()) return valid;
  return spec;
}

TEST(TaskModeTest, EveryModeOfTheEnumHasExactlyOneDefinition) {
  const google::protobuf::EnumDescriptor& modes = *common::v1::Mode_descriptor();
  std::map<int, int> definitions;
  for (const ModeDefinition& m : ModeDefinitions()) ++definitions[m.mode];
  for (int i = 0; i < modes.value_count(); ++i) {
    const auto mode = static_cast<common::v1::Mode>(modes.value(i)->number());
    SCOPED_TRACE(modes.value(i)->name());
    if (mode == common::v1::MODE_UNSPECIFIED) {
      EXPECT_EQ(definitions.count(mode), 0u);
      EXPECT_EQ(FindModeDefinition(mode), nullptr);
      EXPECT_EQ(ModeDefinitionOrDefault(mode).mode, common::v1::MODE_FEDERATED_SYNC);
      continue;
    }
    EXPECT_EQ(definitions[mode], 1);
    const ModeDefinition* m = FindModeDefinition(mode);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->mode, mode);
    // The name task files write, which parses back to the mode.
    EXPECT_EQ(m->name, FriendlyEnumName(*modes.value(i)));
    absl::StatusOr<TaskSpec> spec = ParseTaskSpec(absl::StrCat("mode: ", m->name, "\n"), "t");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->mode(), mode);
    // Its own section is a settings message of the task; shoalctl has columns to show.
    if (!m->sections.own.empty()) {
      const google::protobuf::FieldDescriptor* field =
          TaskSpec::descriptor()->FindFieldByName(m->sections.own);
      ASSERT_NE(field, nullptr) << m->sections.own;
      EXPECT_EQ(field->type(), google::protobuf::FieldDescriptor::TYPE_MESSAGE);
    }
    EXPECT_FALSE(m->round_columns.empty());
    EXPECT_FALSE(m->step.empty());
  }
  // Nothing defined for a number the enum lacks; every definition is of a value of the enum.
  EXPECT_EQ(FindModeDefinition(static_cast<common::v1::Mode>(99)), nullptr);
  EXPECT_EQ(ModeDefinitions().size(), static_cast<size_t>(modes.value_count() - 1));
}

// Each mode's definition decides which optional settings its tasks accept.
TEST(TaskModeTest, ValidationFollowsEachDefinition) {
  for (const ModeDefinition& m : ModeDefinitions()) {
    SCOPED_TRACE(m.name);
    const std::string mode = absl::StrCat("name: x\nmode: ", m.name, "\n");
    EXPECT_TRUE(ParseAndValidate(mode).ok()) << ParseAndValidate(mode).status();
    EXPECT_EQ(ParseAndValidate(mode + "compression: fp16\n").ok(), m.sections.compression);
    EXPECT_EQ(ParseAndValidate(mode + "straggler_factor: 2\n").ok(), m.sections.stragglers);
    EXPECT_EQ(ParseAndValidate(mode + "topology: hierarchical\n").ok(), m.sections.tree);
    if (m.sections.tree) {
      EXPECT_EQ(ParseAndValidate(mode + "topology: hierarchical\nreplicas: 2\n").ok(),
                m.sections.backups);
    }
    // The levels of DP the definition says it takes; a refused level peer says why.
    EXPECT_EQ(ParseAndValidate(mode + "privacy: {dp: {level: sample, clip_norm: 1, "
                                      "noise_multiplier: 1, delta: 1e-5}}\n")
                  .ok(),
              m.sections.dp_sample);
    absl::StatusOr<TaskSpec> peer =
        ParseAndValidate(mode +
                         "min_participants: 3\nprivacy: {dp: {level: peer, clip_norm: 1, "
                         "noise_multiplier: 1, delta: 1e-5}}\n");
    EXPECT_EQ(peer.ok(), m.sections.dp_peer) << peer.status();
    if (!m.sections.dp_peer && m.sections.dp_sample) {
      EXPECT_FALSE(m.sections.dp_peer_refusal.empty());
      EXPECT_THAT(peer.status().message(), HasSubstr(m.sections.dp_peer_refusal));
    }
    // Noise distributed where the peers add it: only with secure aggregation.
    if (m.sections.dp_noise_at_peers) {
      EXPECT_FALSE(ParseAndValidate(mode + "privacy: {dp: {level: peer, noise: distributed, "
                                           "clip_norm: 1, noise_multiplier: 1, delta: 1e-5}}\n")
                       .ok());
    }
    // A mode without rounds takes only mean; one with rounds a robust strategy too.
    EXPECT_EQ(ParseAndValidate(mode + "aggregation: median\n").ok(), m.round_size != nullptr);
    // Another mode's own settings are refused, naming that mode.
    for (const ModeDefinition& other : ModeDefinitions()) {
      if (other.sections.own.empty() || other.mode == m.mode) continue;
      absl::StatusOr<TaskSpec> bad = ParseAndValidate(mode + other.sections.own + ": {}\n");
      ASSERT_FALSE(bad.ok()) << other.name;
      EXPECT_THAT(bad.status().message(),
                  HasSubstr(absl::StrCat(other.sections.own, ": settings for mode ", other.name,
                                         ", but this task's mode is ", m.name)));
    }
  }
}

TEST(TaskModeTest, RoundSizeIsTheModesCappedByTheClusterSize) {
  absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\nmin_participants: 6\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(RoundSizeOf(*spec).updates, 6u);
  EXPECT_EQ(RoundSizeOf(*spec).field, "min_participants");
  spec = ParseAndValidate(
      "name: x\nmode: federated-async\nmin_participants: 6\nasync: {buffer_size: 3}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(RoundSizeOf(*spec).updates, 3u);
  EXPECT_EQ(RoundSizeOf(*spec).field, "async.buffer_size");
  spec =
      ParseAndValidate("name: x\nmin_participants: 6\ntopology: hierarchical\ncluster_size: 4\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(RoundSizeOf(*spec).updates, 4u);
  EXPECT_EQ(RoundSizeOf(*spec).field, "cluster_size");
  spec = ParseAndValidate("name: x\nmode: gossip\nmin_participants: 6\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(RoundSizeOf(*spec).updates, 0u);  // no rounds
}

TEST(TaskModeTest, AnUnknownModeIsRefusedNamingTheDefinedOnes) {
  absl::StatusOr<TaskSpec> spec = ParseTaskSpec("name: x\n", "t");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_mode(static_cast<common::v1::Mode>(7));
  EXPECT_EQ(ValidateTaskSpec(*spec).message(),
            "mode: unsupported value \"unknown(7)\" (expected federated-sync, decentralized, "
            "gossip, federated-async)");
}

}  // namespace
}  // namespace shoal::task
