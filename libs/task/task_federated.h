#pragma once

// The settings of the federated modes in a task (protos/shoal/common/v1/task.proto): how peers'
// updates travel to the aggregator (compression and the topk_* fields), and stragglers
// (straggler_factor, straggler_rounds), and their topology (topology, cluster_size).

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::task {

inline constexpr uint32_t kMaxTopKWarmupRounds = 10;  // 2^10 x any useful ratio is already 1
inline constexpr uint32_t kDefaultTopKMinElements = 4096;
inline constexpr uint32_t kDefaultStragglerRounds = 2;
inline constexpr uint32_t kDefaultClusterSize = 32;
inline constexpr uint32_t kMaxClusterSize = 10000;
inline constexpr uint32_t kDefaultFanout = 32;
inline constexpr uint32_t kMaxFanout = 1000;
inline constexpr uint32_t kDefaultReplicas = 1;
inline constexpr uint32_t kMaxReplicas = 8;

// Checks the compression rules of task.proto. INVALID_ARGUMENT "<field>: <what>", e.g.
// "topk_ratio: must be in (0, 1], got 0". Part of ValidateTaskSpec.
absl::Status ValidateCompression(const common::v1::TaskSpec& spec);

// compression none when unset; for topk: topk_ratio 0.01, topk_values none,
// topk_warmup_rounds 0, topk_min_elements kDefaultTopKMinElements, topk_split per-tensor.
void ApplyCompressionDefaults(common::v1::TaskSpec& spec);

// straggler_factor 0 (off) or in (1, 100], federated-sync only; straggler_rounds 1..100, only
// with straggler_factor. Part of ValidateTaskSpec.
absl::Status ValidateStragglers(const common::v1::TaskSpec& spec);
// straggler_rounds kDefaultStragglerRounds when straggler_factor is set.
void ApplyStragglerDefaults(common::v1::TaskSpec& spec);

// topology flat or hierarchical; hierarchical only in federated-sync and federated-async (not
// supported on a tree yet in the other modes); cluster_size 2..kMaxClusterSize, fanout
// 2..kMaxFanout and replicas 1..kMaxReplicas (1 in federated-async), only with hierarchical.
// Part of ValidateTaskSpec.
absl::Status ValidateTopology(const common::v1::TaskSpec& spec);
// cluster_size kDefaultClusterSize, fanout kDefaultFanout and replicas kDefaultReplicas for a
// hierarchical task.
void ApplyTopologyDefaults(common::v1::TaskSpec& spec);

inline bool IsHierarchical(const common::v1::TaskSpec& spec) {
  return spec.topology() == common::v1::TOPOLOGY_HIERARCHICAL;
}
// The most peers one aggregator of the task's tree serves (its default when unset).
inline size_t ClusterSizeOf(const common::v1::TaskSpec& spec) {
  return spec.has_cluster_size() ? spec.cluster_size() : kDefaultClusterSize;
}
// The aggregators of each cluster below the root: its primary and the backups.
inline size_t ReplicasOf(const common::v1::TaskSpec& spec) {
  return spec.has_replicas() ? spec.replicas() : kDefaultReplicas;
}

}  // namespace shoal::task
