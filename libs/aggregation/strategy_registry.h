#pragma once

// What a strategy file defines: the registry behind MakeStrategy. Internal to libs/aggregation.
//
// Adding a strategy touches four files:
//   1. protos/shoal/common/v1/task.proto: its Aggregation value (and any new parameter as an
//      AggregationOptions field);
//   2. libs/aggregation/<name>_strategy.cc: its Aggregation subclass (StoredUpdates for a
//      non-streaming one) and the function that defines it,
//        std::vector<StrategyDefinition> <Name>Strategies() { return {...definition...}; }
//   3. this file: that function's declaration, and its line in AllStrategyDefinitions'
//      table (strategy.cc);
//   4. libs/aggregation/CMakeLists.txt: the file.
// Task-file parsing, validation, JSON and the friendly name then follow from the enum and the
// definition; tests/unit/aggregation_strategy_test.cc checks that every enum value has exactly
// one strategy.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libs/aggregation/strategy.h"

namespace shoal::aggregation::internal {

// The fewest updates a round needs for a strategy to run as configured, and why, e.g.
// {7, "2f+3 with byzantine_peers f = 2"}.
struct MinUpdates {
  uint64_t updates = 0;
  std::string why;
};

struct StrategyDefinition {
  common::v1::Aggregation kind = common::v1::AGGREGATION_UNSPECIFIED;
  bool streaming = false;
  // The AggregationOptions fields it reads; setting any other is an error.
  std::vector<std::string> params;
  // Sets defaults of its unset parameters (null: none).
  void (*apply_defaults)(common::v1::AggregationOptions& params) = nullptr;
  // Checks its parameters (defaults applied). Errors are INVALID_ARGUMENT "<field>: <what>",
  // the field relative to aggregation_options (null: nothing to check).
  absl::Status (*validate)(const common::v1::AggregationOptions& params) = nullptr;
  // The fewest updates per round its parameters need; fewer make it degrade (null: any number).
  // A task whose rounds may be smaller is refused.
  MinUpdates (*min_updates)(const common::v1::AggregationOptions& params) = nullptr;
  // Starts a round; `params` has defaults applied and passed `validate`.
  std::unique_ptr<Aggregation> (*start)(tensor::ModelLayout layout, size_t expected_updates,
                                        int threads,
                                        const common::v1::AggregationOptions& params) = nullptr;
};

// The strategies of each file: one function per libs/aggregation/<name>_strategy.cc.
std::vector<StrategyDefinition> MeanStrategies();
std::vector<StrategyDefinition> MedianStrategies();
std::vector<StrategyDefinition> TrimmedMeanStrategies();
std::vector<StrategyDefinition> KrumStrategies();  // krum and multi-krum
std::vector<StrategyDefinition> CenteredClippingStrategies();

// Every registered definition: the table in strategy.cc lists the functions above.
std::vector<StrategyDefinition> AllStrategyDefinitions();

}  // namespace shoal::aggregation::internal
