// The coordinator's mode registry: every mode with a definition (libs/task/task_mode.h) has
// exactly one ModeTask factory, which makes that mode's state machine; nothing else is run.

#include <prometheus/registry.h>

#include <map>
#include <memory>

#include "gtest/gtest.h"
#include "libs/task/task_file.h"
#include "libs/task/task_mode.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/modes/aggregator_mode_task.h"

namespace shoal::coordinator {
namespace {

// A new task of `mode`, with the defaults a task file gets.
v1::TaskStatus StatusOf(common::v1::Mode mode) {
  v1::TaskStatus status;
  common::v1::TaskSpec& spec = *status.mutable_spec();
  spec = task::DefaultTaskSpec();
  spec.set_name("registry");
  spec.set_mode(mode);
  task::ApplyTaskDefaults(spec);
  spec.set_mode(mode);  // UNSPECIFIED stays so, for the registry to refuse
  status.set_state(v1::TASK_STATE_WAITING);
  return status;
}

TEST(CoordinatorModeRegistryTest, EveryDefinedModeHasExactlyOneModeTask) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  std::map<common::v1::Mode, int> registered;
  for (const CoordinatorMode& mode : RegisteredModes()) ++registered[mode.mode];
  for (const task::ModeDefinition& def : task::ModeDefinitions()) {
    SCOPED_TRACE(def.name);
    EXPECT_EQ(registered[def.mode], 1);
    std::unique_ptr<ModeTask> task = MakeModeTask(StatusOf(def.mode), ModeOptions(), metrics);
    ASSERT_NE(task, nullptr);
    // The state machine is one of those that work through an aggregator exactly when the
    // definition says the mode uses one.
    EXPECT_EQ(dynamic_cast<AggregatorModeTask*>(task.get()) != nullptr, def.uses_aggregator);
  }
  EXPECT_EQ(registered.size(), task::ModeDefinitions().size());
  for (int mode : {0, 99}) {
    EXPECT_EQ(MakeModeTask(StatusOf(static_cast<common::v1::Mode>(mode)), ModeOptions(), metrics),
              nullptr)
        << mode;
  }
}

}  // namespace
}  // namespace shoal::coordinator
