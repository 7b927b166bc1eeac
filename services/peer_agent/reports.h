#pragma once

// The session messages that the host and every mode send alike, built in one place. They leave
// PeerMessage.task empty: the host stamps it on whatever a runner sends (ModeRunnerDeps::send).

#include <cstdint>

#include "absl/status/status.h"
#include "libs/training/trainer.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

// EvalReport of model `version` evaluated on this peer's test slice.
coordinator::v1::PeerMessage MakeEvalReport(uint64_t version, const training::EvalStats& eval);

// PeerError: this peer could not take part in `round` (0: in the task) because of `status`.
coordinator::v1::PeerMessage MakePeerError(uint64_t round, const absl::Status& status);

}  // namespace shoal::peer
