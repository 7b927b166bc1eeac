// dpwa configuration files: parse; a config that parses has unique node names, valid ports and
// a GossipSpec that validates. Errors must be clean.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "libs/gossip/dpwa_config.h"
#include "libs/gossip/gossip_spec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<shoal::gossip::DpwaConfig> config =
      shoal::gossip::ParseDpwaConfig(text, "fuzz.yaml");
  shoal::fuzz::CheckErrorIsClean(config.status());
  if (!config.ok()) return 0;
  SHOAL_FUZZ_CHECK(!config->nodes.empty());
  std::set<std::string> names;
  for (const shoal::gossip::DpwaNode& node : config->nodes) {
    SHOAL_FUZZ_CHECK(node.port >= 1);
    SHOAL_FUZZ_CHECK(names.insert(node.name).second);
    SHOAL_FUZZ_CHECK(config->Find(node.name) != nullptr);
    SHOAL_FUZZ_CHECK(!node.address().empty());
  }
  SHOAL_FUZZ_CHECK(shoal::gossip::ValidateGossipSpec(config->gossip, "").ok());
  return 0;
}
