// Task files (YAML and JSON; fuzz_task_yaml and fuzz_task_json differ only in their seeds):
// parse, validate, and for a file that parses, check that its JSON rendering parses back to
// the same spec. Errors must be clean (no raw control bytes).

#include <cstddef>
#include <cstdint>
#include <string>

#include "libs/task/task_file.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using shoal::fuzz::CheckErrorIsClean;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<shoal::common::v1::TaskSpec> spec = shoal::task::ParseTaskSpec(text, "fuzz.yaml");
  CheckErrorIsClean(spec.status());
  if (!spec.ok()) return 0;
  CheckErrorIsClean(shoal::task::ValidateTaskSpec(*spec));
  const std::string json = shoal::task::MessageToFriendlyJson(*spec, 0);
  absl::StatusOr<shoal::common::v1::TaskSpec> back = shoal::task::ParseTaskSpec(json, "back.json");
  SHOAL_FUZZ_CHECK(back.ok());
  SHOAL_FUZZ_CHECK(back->SerializeAsString() == spec->SerializeAsString());
  return 0;
}
