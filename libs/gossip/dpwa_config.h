#pragma once

// dpwa's YAML configuration file, read unchanged: a list of single-key maps
//
//   - nodes:
//     - {name: w1, host: localhost, port: 45000}
//     - {name: w2, host: localhost, port: 45001}
//   - fetch_probability: 1
//   - timeout_ms: 2500
//   - interpolation: constant        # constant | clock | loss
//   - divergence_threshold: 0.2      # 0 = off
//   - constant: { value: 0.5 }
//   - clock: 0                       # dpwa placeholders, accepted and ignored
//   - loss: 0
//
// A single mapping with the same keys is accepted too. Shoal extensions (optional):
// `include_buffers: bool`, `mix_post_step: bool` (dpwa's literal mixing order) and
// `flow_control: {initial, min, max, success_bonus, failure_penalty, random_min, random_max}`.
// Keys left out keep GossipSpec's defaults. Every error is INVALID_ARGUMENT and reads
// "<source>:<line>: <key>: <what is wrong>", with names and values from the file escaped.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::gossip {

// Larger or more deeply nested configs are refused before they are parsed.
inline constexpr size_t kMaxDpwaConfigBytes = size_t{1} << 20;  // 1 MiB
inline constexpr int kMaxDpwaConfigDepth = 32;                  // nested mappings and lists

struct DpwaNode {
  std::string name;
  std::string host;
  uint16_t port = 0;
  std::string address() const;  // HOST:PORT ([HOST]:PORT for an IPv6 literal)
};

struct DpwaConfig {
  std::vector<DpwaNode> nodes;    // in file order; names are unique
  common::v1::GossipSpec gossip;  // only the fields the file sets
  // The node named `name`, nullptr when there is none.
  const DpwaNode* Find(absl::string_view name) const;
};

// Parses and checks a dpwa configuration. `source` (the file name) starts every error.
absl::StatusOr<DpwaConfig> ParseDpwaConfig(absl::string_view text, absl::string_view source);

// Reads and parses the file. Errors: NOT_FOUND missing file, INVALID_ARGUMENT anything in it.
absl::StatusOr<DpwaConfig> LoadDpwaConfig(const std::string& path);

}  // namespace shoal::gossip
