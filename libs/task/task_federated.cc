#include "libs/task/task_federated.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/task/field_error.h"
#include "libs/task/task_file.h"
#include "libs/task/task_mode.h"

namespace shoal::task {
namespace {

using common::v1::TaskSpec;

// The task's mode (UNSPECIFIED: the default; ValidateTaskSpec refuses unknown ones first).
const ModeDefinition& ModeOf(const TaskSpec& spec) { return ModeDefinitionOrDefault(spec.mode()); }

std::string CompressionName(common::v1::Compression c) {
  return JsonQuote(FriendlyEnumName(*common::v1::Compression_descriptor(), c));
}

}  // namespace

absl::Status ValidateCompression(const TaskSpec& spec) {
  const common::v1::Compression c = spec.compression();
  if (!common::v1::Compression_IsValid(c)) {
    return FieldError("compression", absl::StrCat("unsupported value ", CompressionName(c),
                                                  " (expected none, fp16, int8, topk)"));
  }
  const bool compressed =
      c != common::v1::COMPRESSION_NONE && c != common::v1::COMPRESSION_UNSPECIFIED;
  if (compressed && !ModeOf(spec).sections.compression) {
    return FieldError(
        "compression",
        absl::StrCat(CompressionName(c), " compresses the updates peers send (",
                     ModeNames([](const ModeDefinition& m) { return m.sections.compression; }),
                     "); this task's mode is ", ModeOf(spec).name,
                     ", whose peers send no updates (set compression: none)"));
  }
  if (c != common::v1::COMPRESSION_TOPK) {
    const char* topk_only = spec.has_topk_ratio()               ? "topk_ratio"
                            : spec.topk_values() != 0 /*unset*/ ? "topk_values"
                            : spec.has_topk_warmup_rounds()     ? "topk_warmup_rounds"
                            : spec.has_topk_min_elements()      ? "topk_min_elements"
                            : spec.topk_split() != 0 /*unset*/  ? "topk_split"
                                                                : nullptr;
    if (topk_only != nullptr) return FieldError(topk_only, "only with compression: topk");
    return absl::OkStatus();
  }
  if (!(spec.topk_ratio() > 0 && spec.topk_ratio() <= 1)) {
    return FieldError("topk_ratio",
                      absl::StrCat("must be in (0, 1], got ", ShowNumber(spec.topk_ratio())));
  }
  if (spec.topk_warmup_rounds() > kMaxTopKWarmupRounds) {
    return FieldError("topk_warmup_rounds", absl::StrCat("must be at most ", kMaxTopKWarmupRounds,
                                                         ", got ", spec.topk_warmup_rounds()));
  }
  const common::v1::Compression v = spec.topk_values();
  if (v != common::v1::COMPRESSION_UNSPECIFIED && v != common::v1::COMPRESSION_NONE &&
      v != common::v1::COMPRESSION_FP16 && v != common::v1::COMPRESSION_INT8) {
    return FieldError("topk_values", absl::StrCat("unsupported value ", CompressionName(v),
                                                  " (expected none, fp16, int8)"));
  }
  if (!common::v1::TopkSplit_IsValid(spec.topk_split())) {
    return FieldError("topk_split",
                      absl::StrCat("unsupported value ",
                                   JsonQuote(FriendlyEnumName(*common::v1::TopkSplit_descriptor(),
                                                              spec.topk_split())),
                                   " (expected per-tensor, equal)"));
  }
  return absl::OkStatus();
}

void ApplyCompressionDefaults(TaskSpec& spec) {
  if (spec.compression() == common::v1::COMPRESSION_UNSPECIFIED) {
    spec.set_compression(common::v1::COMPRESSION_NONE);
  }
  if (spec.compression() != common::v1::COMPRESSION_TOPK) return;
  if (!spec.has_topk_ratio()) spec.set_topk_ratio(0.01);
  if (!spec.has_topk_warmup_rounds()) spec.set_topk_warmup_rounds(0);
  if (!spec.has_topk_min_elements()) spec.set_topk_min_elements(kDefaultTopKMinElements);
  if (spec.topk_values() == common::v1::COMPRESSION_UNSPECIFIED) {
    spec.set_topk_values(common::v1::COMPRESSION_NONE);
  }
  if (spec.topk_split() == common::v1::TOPK_SPLIT_UNSPECIFIED) {
    spec.set_topk_split(common::v1::TOPK_SPLIT_PER_TENSOR);
  }
}

absl::Status ValidateStragglers(const TaskSpec& spec) {
  const double factor = spec.straggler_factor();
  if (factor == 0) {
    if (spec.has_straggler_rounds()) {
      return FieldError("straggler_rounds", "only with straggler_factor");
    }
    return absl::OkStatus();
  }
  if (!(factor > 1 && factor <= 100) || !std::isfinite(factor)) {
    return FieldError("straggler_factor",
                      absl::StrCat("must be 0 (off) or in (1, 100], got ", ShowNumber(factor)));
  }
  if (!ModeOf(spec).sections.stragglers) {
    return FieldError(
        "straggler_factor",
        absl::StrCat(
            "stragglers move out of the rounds of ",
            ModeNames([](const ModeDefinition& m) { return m.sections.stragglers; }, " or "),
            "; this task's mode is ", ModeOf(spec).name, " (remove straggler_factor)"));
  }
  if (spec.straggler_rounds() < 1 || spec.straggler_rounds() > 100) {
    return FieldError("straggler_rounds",
                      absl::StrCat("must be in 1..100, got ", spec.straggler_rounds()));
  }
  return absl::OkStatus();
}

void ApplyStragglerDefaults(TaskSpec& spec) {
  if (spec.straggler_factor() != 0 && !spec.has_straggler_rounds()) {
    spec.set_straggler_rounds(kDefaultStragglerRounds);
  }
}

absl::Status ValidateTopology(const TaskSpec& spec) {
  const common::v1::Topology t = spec.topology();
  if (!common::v1::Topology_IsValid(t)) {
    return FieldError("topology", absl::StrCat("unsupported value ", static_cast<int>(t),
                                               " (expected flat, hierarchical)"));
  }
  if (t != common::v1::TOPOLOGY_HIERARCHICAL) {
    if (spec.has_cluster_size()) {
      return FieldError("cluster_size", "only with topology: hierarchical");
    }
    if (spec.has_fanout()) return FieldError("fanout", "only with topology: hierarchical");
    if (spec.has_replicas()) return FieldError("replicas", "only with topology: hierarchical");
    return absl::OkStatus();
  }
  const auto not_yet = [](absl::string_view field, absl::string_view what) {
    return FieldError(field, absl::StrCat(what, " does not run on a tree of aggregators yet ",
                                          "(topology: hierarchical; see "
                                          "docs/explanation/supernode-trees.md)"));
  };
  const ModeDefinition& mode = ModeOf(spec);
  if (!mode.sections.tree) return not_yet("topology", absl::StrCat("mode ", mode.name));
  if (spec.has_cluster_size() &&
      (spec.cluster_size() < 2 || spec.cluster_size() > kMaxClusterSize)) {
    return FieldError("cluster_size", absl::StrCat("must be in 2..", kMaxClusterSize, ", got ",
                                                   spec.cluster_size()));
  }
  if (spec.has_fanout() && (spec.fanout() < 2 || spec.fanout() > kMaxFanout)) {
    return FieldError("fanout",
                      absl::StrCat("must be in 2..", kMaxFanout, ", got ", spec.fanout()));
  }
  if (spec.has_replicas() && (spec.replicas() < 1 || spec.replicas() > kMaxReplicas)) {
    return FieldError("replicas", absl::StrCat("must be in 1..", kMaxReplicas,
                                               " (a cluster's "
                                               "primary and its backups), got ",
                                               spec.replicas()));
  }
  if (!mode.sections.backups && spec.replicas() > 1) {
    return FieldError(
        "replicas",
        absl::StrCat("a ", mode.name, " tree keeps no backups (they take over rounds of ",
                     ModeNames([](const ModeDefinition& m) { return m.sections.backups; }, " or "),
                     "), got ", spec.replicas(), "; remove it or set 1"));
  }
  return absl::OkStatus();
}

void ApplyTopologyDefaults(TaskSpec& spec) {
  if (spec.topology() != common::v1::TOPOLOGY_HIERARCHICAL) return;
  if (!spec.has_cluster_size()) spec.set_cluster_size(kDefaultClusterSize);
  if (!spec.has_fanout()) spec.set_fanout(kDefaultFanout);
  if (!spec.has_replicas()) spec.set_replicas(kDefaultReplicas);
}

}  // namespace shoal::task
