#pragma once

// Helpers of the task file tests (task_file_test, task_sections_test).

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "libs/task/task_file.h"

namespace shoal::task {

// A task file of tests/data/tasks/.
inline std::string DataPath(const std::string& name) {
  const char* root = std::getenv("SHOAL_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/tasks/" + name;
}

// ParseTaskSpec, then ValidateTaskSpec.
inline absl::StatusOr<common::v1::TaskSpec> ParseAndValidate(const std::string& text) {
  absl::StatusOr<common::v1::TaskSpec> spec = ParseTaskSpec(text, "t.yaml");
  if (!spec.ok()) return spec.status();
  absl::Status valid = ValidateTaskSpec(*spec);
  if (!valid.ok()) return valid;
  return spec;
}

// A spec that renders as JSON and parses back to itself, as `shoalctl task status --json`
// and the fuzz targets require.
inline void ExpectJsonRoundTrip(const common::v1::TaskSpec& spec) {
  const std::string json = MessageToFriendlyJson(spec, 2);
  absl::StatusOr<common::v1::TaskSpec> back = ParseTaskSpec(json, "back.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(back->SerializeAsString(), spec.SerializeAsString()) << json;
}

}  // namespace shoal::task
