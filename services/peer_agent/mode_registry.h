#pragma once

// Which ModeRunner runs a task of which training mode: a table, one line per mode
// (mode_registry.cc; each mode's folder under services/peer_agent/modes/ defines its factory).
// Nothing else on the peer looks at TaskSpec.mode but the mode folders; what every side of the
// system knows of a mode is its ModeDefinition (libs/task/task_mode.h).

#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/peer_agent/mode_runner.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::peer {

// Creates the runner of one task from its dependencies. Errors: INVALID_ARGUMENT when a
// dependency the mode needs is missing or the task is not of that mode.
using ModeRunnerFactory = absl::StatusOr<std::unique_ptr<ModeRunner>> (*)(ModeRunnerDeps deps);

struct ModeEntry {
  common::v1::Mode mode;
  ModeRunnerFactory create;
};

// Every mode this peer can run, in the order of the Mode enum.
absl::Span<const ModeEntry> RegisteredModes();

// The entry of `mode`, or nullptr when this peer cannot run it.
const ModeEntry* FindMode(common::v1::Mode mode);

// Creates the runner for deps.assigned.spec().mode(). Errors: INVALID_ARGUMENT naming the mode
// when no runner is registered for it, or the factory's error.
absl::StatusOr<std::unique_ptr<ModeRunner>> CreateModeRunner(ModeRunnerDeps deps);

}  // namespace shoal::peer
