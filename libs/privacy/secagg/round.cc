#include "libs/privacy/secagg/round.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy::secagg {
namespace {

absl::Status ConfigError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("SecAggConfig.", field, ": ", what));
}

}  // namespace

absl::StatusOr<SecAggRound> SecAggRound::Create(const v1::SecAggConfig& config) {
  if (config.round_id().empty()) return ConfigError("round_id", "is empty");
  const int n = config.participant_ids_size();
  if (n < kMinParticipants || n > kMaxParticipants) {
    return ConfigError("participant_ids", absl::StrCat(n, " participants; ", kMinParticipants,
                                                       " to ", kMaxParticipants, " are needed"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (int i = 0; i < n; ++i) {
    const std::string& id = config.participant_ids(i);
    if (id.empty()) return ConfigError(absl::StrCat("participant_ids[", i, "]"), "is empty");
    if (!seen.insert(id).second) {
      return ConfigError(absl::StrCat("participant_ids[", i, "]"),
                         absl::StrCat("\"", id, "\" is listed twice"));
    }
  }
  if (config.neighbourhood_size() < 2) {
    return ConfigError("neighbourhood_size",
                       absl::StrCat("must be at least 2, got ", config.neighbourhood_size()));
  }
  const int degree = static_cast<int>(
      std::min<uint32_t>(config.neighbourhood_size(), static_cast<uint32_t>(n - 1)));
  if (degree < n - 1 && config.graph_seed().size() != kSharedSeedSize) {
    return ConfigError("graph_seed", absl::StrCat("must be ", kSharedSeedSize, " bytes, got ",
                                                  config.graph_seed().size()));
  }
  if (config.ring_bits() < 1 || config.ring_bits() > 32) {
    return ConfigError("ring_bits", absl::StrCat("must be in [1, 32], got ", config.ring_bits()));
  }
  if (config.vector_length() < 1 || config.vector_length() > kMaxVectorLength) {
    return ConfigError("vector_length", absl::StrCat("must be in [1, ", kMaxVectorLength, "], got ",
                                                     config.vector_length()));
  }
  std::vector<std::string> ids(config.participant_ids().begin(), config.participant_ids().end());
  SHOAL_ASSIGN_OR_RETURN(NeighbourhoodGraph graph,
                         NeighbourhoodGraph::Create(std::move(ids), degree, config.graph_seed()));
  const uint32_t t = config.threshold();
  if (t < 2) return ConfigError("threshold", absl::StrCat("must be at least 2, got ", t));
  if (t > static_cast<uint32_t>(graph.min_degree())) {
    return ConfigError("threshold",
                       absl::StrCat(t, " exceeds the ", graph.min_degree(),
                                    " neighbours of a participant (neighbourhood_size ",
                                    config.neighbourhood_size(), ", ", n, " participants)"));
  }
  if (2 * t <= static_cast<uint32_t>(graph.max_degree())) {
    return ConfigError(
        "threshold",
        absl::StrCat(t, " must be more than half of the largest neighbourhood (",
                     graph.max_degree(),
                     " neighbours): two disjoint sets of t neighbours could reveal both of a "
                     "participant's secrets"));
  }
  return SecAggRound(config, std::move(graph));
}

uint32_t SecAggRound::ring_mask() const {
  return bits() == 32 ? 0xffffffffu : (uint32_t{1} << bits()) - 1;
}

}  // namespace shoal::privacy::secagg
