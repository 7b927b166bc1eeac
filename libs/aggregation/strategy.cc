#include "libs/aggregation/strategy.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/aggregation/strategy_registry.h"
#include "libs/common/escape.h"
#include "libs/common/parallel_for.h"

namespace shoal::aggregation {

namespace internal {

std::vector<StrategyDefinition> AllStrategyDefinitions() {
  // One line per strategy file.
  constexpr std::vector<StrategyDefinition> (*kFiles[])() = {
      &MeanStrategies, &MedianStrategies,           &TrimmedMeanStrategies,
      &KrumStrategies, &CenteredClippingStrategies,
  };
  std::vector<StrategyDefinition> all;
  for (auto* file : kFiles) {
    for (StrategyDefinition& d : file()) all.push_back(std::move(d));
  }
  return all;
}

}  // namespace internal

namespace {

namespace pb = ::google::protobuf;
using common::v1::AggregationOptions;
using common::v1::TaskSpec;
using internal::StrategyDefinition;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Index of the first non-finite value of `values`, or values.size(). The scan keeps the
// largest exponent field, which vectorises; only a bad update pays for finding the index.
size_t FirstNonFinite(absl::Span<const float> values, int threads) {
  constexpr uint32_t kExponent = 0x7f800000u;
  std::atomic<bool> bad{false};
  const float* x = values.data();
  common::ParallelFor(values.size(), threads, [&bad, x](size_t begin, size_t end) {
    uint32_t most = 0;
    for (size_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, sizeof bits);
      most = std::max(most, bits & kExponent);
    }
    if (most == kExponent) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return values.size();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return values.size();
}

const StrategyDefinition* Find(const std::vector<StrategyDefinition>& all,
                               common::v1::Aggregation kind) {
  for (const StrategyDefinition& d : all) {
    if (d.kind == kind) return &d;
  }
  return nullptr;
}

std::string RegisteredNames(const std::vector<StrategyDefinition>& all) {
  std::vector<std::string> names;
  for (const StrategyDefinition& d : all) names.push_back(StrategyName(d.kind));
  return absl::StrJoin(names, ", ");
}

absl::Status UnsupportedKind(const std::vector<StrategyDefinition>& all,
                             common::v1::Aggregation kind) {
  return FieldError("aggregation", absl::StrCat("unsupported value \"", StrategyName(kind),
                                                "\" (expected ", RegisteredNames(all), ")"));
}

// Every set field of `params` must be one that `def` reads.
absl::Status CheckParamsBelong(const std::vector<StrategyDefinition>& all,
                               const StrategyDefinition& def, const AggregationOptions& params) {
  const pb::Descriptor& type = *params.GetDescriptor();
  const pb::Reflection& reflection = *params.GetReflection();
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor& field = *type.field(i);
    if (!reflection.HasField(params, &field)) continue;
    if (std::find(def.params.begin(), def.params.end(), field.name()) != def.params.end()) {
      continue;
    }
    std::vector<std::string> users;
    for (const StrategyDefinition& d : all) {
      if (std::find(d.params.begin(), d.params.end(), field.name()) != d.params.end()) {
        users.push_back(StrategyName(d.kind));
      }
    }
    const std::string name = StrategyName(def.kind);
    return FieldError(
        absl::StrCat("aggregation_options.", field.name()),
        users.empty()
            ? absl::StrCat("no registered strategy uses it (aggregation is ", name, ")")
            : absl::StrCat("used only by aggregation ", absl::StrJoin(users, " or "),
                           ", but aggregation is ", name, " (remove it or change aggregation)"));
  }
  return absl::OkStatus();
}

// The least number of updates a round of a task will have, and the task field that says so.
struct RoundSizeBound {
  uint64_t updates = 0;  // 0: unknown
  absl::string_view field;
};

// The parameters with defaults applied, checked (and against `bound` when it is known).
absl::StatusOr<AggregationOptions> ResolveParams(const std::vector<StrategyDefinition>& all,
                                                 const StrategyDefinition& def,
                                                 const AggregationOptions& params,
                                                 const RoundSizeBound& bound) {
  absl::Status belong = CheckParamsBelong(all, def, params);
  if (!belong.ok()) return belong;
  AggregationOptions resolved = params;
  if (def.apply_defaults != nullptr) def.apply_defaults(resolved);
  if (def.validate != nullptr) {
    absl::Status valid = def.validate(resolved);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("aggregation_options.", valid.message()));
    }
  }
  if (def.min_updates != nullptr && bound.updates > 0) {
    const internal::MinUpdates need = def.min_updates(resolved);
    if (bound.updates < need.updates) {
      return FieldError(bound.field,
                        absl::StrCat(StrategyName(def.kind), " needs at least ", need.updates,
                                     " updates per round (", need.why, "), got ", bound.updates));
    }
  }
  return resolved;
}

}  // namespace

Aggregation::Aggregation(tensor::ModelLayout layout, int threads)
    : layout_(std::move(layout)), threads_(std::max(threads, 1)) {}

absl::Status Aggregation::Add(absl::Span<const float> delta, double weight,
                              absl::string_view contributor, bool finite) {
  if (delta.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta has ", delta.size(), " values; the model has ", layout_.total_elements()));
  }
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::InvalidArgumentError(absl::StrCat("update weight ", weight, " must be > 0"));
  }
  if (contributors_.find(contributor) != contributors_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("contributor ", QuoteBytes(contributor),
                                                   " already added an update to this round"));
  }
  // A NaN poisons a mean, and breaks the ordering the robust strategies sort by.
  const size_t bad = finite ? delta.size() : FirstNonFinite(delta, threads_);
  if (bad != delta.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: non-finite value ", delta[bad], " at ", layout_.DescribeElement(bad)));
  }
  absl::Status folded = Fold(delta, weight, contributor);
  if (!folded.ok()) return folded;
  contributors_.emplace(contributor);
  total_weight_ += weight;
  return absl::OkStatus();
}

absl::StatusOr<AggregationReport> Aggregation::ApplyInto(const tensor::FlatModel& base,
                                                         std::vector<float>& out) const {
  if (!(base.layout == layout_) || base.values.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError("base model does not match the aggregation's layout");
  }
  if (&out == &base.values) {
    return absl::InvalidArgumentError("the output buffer must not be the base model's");
  }
  if (count() == 0) {
    out.assign(base.values.begin(), base.values.end());
    AggregationReport report;
    report.note = "no updates: the result is the base model";
    return report;
  }
  return Combine(base, out);
}

void Aggregation::Reset() {
  contributors_.clear();
  total_weight_ = 0;
  Clear();
}

Summation SummationOf(const common::v1::AggregationOptions& params) {
  return params.exact_sum() ? Summation::kExact : Summation::kFloat;
}

bool Strategy::order_independent() const {
  return !streaming_ || SummationOf(params_) == Summation::kExact;
}

uint64_t Strategy::RoundMemoryBytes(size_t updates, uint64_t model_bytes) const {
  if (!streaming_) return static_cast<uint64_t>(updates) * model_bytes;
  // An exact sum holds 16 bytes a value, 4x a float model.
  return params_.exact_sum() ? 4 * model_bytes : model_bytes;
}

std::unique_ptr<Aggregation> Strategy::Start(tensor::ModelLayout layout,
                                             size_t expected_updates) const {
  return start_(std::move(layout), expected_updates, threads_, params_);
}

absl::StatusOr<Strategy> MakeStrategy(const StrategyOptions& options) {
  const std::vector<StrategyDefinition> all = internal::AllStrategyDefinitions();
  const StrategyDefinition* def = Find(all, options.kind);
  if (def == nullptr) return UnsupportedKind(all, options.kind);
  absl::StatusOr<AggregationOptions> params = ResolveParams(all, *def, options.params, {});
  if (!params.ok()) return params.status();
  Strategy strategy;
  strategy.kind_ = def->kind;
  strategy.name_ = StrategyName(def->kind);
  strategy.params_ = *std::move(params);
  strategy.streaming_ = def->streaming;
  strategy.threads_ = std::max(options.threads, 1);
  strategy.start_ = def->start;
  return strategy;
}

absl::StatusOr<Strategy> MakeStrategy(const TaskSpec& spec, int threads) {
  StrategyOptions options;
  options.kind = spec.aggregation();
  options.params = spec.aggregation_options();
  options.threads = threads;
  return MakeStrategy(options);
}

absl::Status ValidateAggregation(const TaskSpec& spec, uint64_t round_updates,
                                 absl::string_view round_field) {
  const std::vector<StrategyDefinition> all = internal::AllStrategyDefinitions();
  const StrategyDefinition* def = Find(all, spec.aggregation());
  if (def == nullptr) return UnsupportedKind(all, spec.aggregation());
  return ResolveParams(all, *def, spec.aggregation_options(), {round_updates, round_field})
      .status();
}

void ApplyAggregationDefaults(TaskSpec& spec) {
  const std::vector<StrategyDefinition> all = internal::AllStrategyDefinitions();
  const StrategyDefinition* def = Find(all, spec.aggregation());
  if (def != nullptr && def->apply_defaults != nullptr) {
    def->apply_defaults(*spec.mutable_aggregation_options());
  }
}

std::string StrategyName(common::v1::Aggregation kind) {
  const pb::EnumValueDescriptor* value =
      common::v1::Aggregation_descriptor()->FindValueByNumber(kind);
  if (value == nullptr) return absl::StrCat("unknown(", static_cast<int>(kind), ")");
  std::string name = absl::AsciiStrToLower(value->name());
  constexpr absl::string_view kPrefix = "aggregation_";
  if (absl::StartsWith(name, kPrefix)) name.erase(0, kPrefix.size());
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::vector<common::v1::Aggregation> RegisteredStrategies() {
  std::vector<common::v1::Aggregation> kinds;
  for (const StrategyDefinition& d : internal::AllStrategyDefinitions()) kinds.push_back(d.kind);
  return kinds;
}

}  // namespace shoal::aggregation
