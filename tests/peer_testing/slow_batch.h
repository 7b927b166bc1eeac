#pragma once

// The slow peer of the peer's test build (shoal-peer-testing --test-slow-batch MS): every
// training batch takes MS milliseconds longer, in every mode, to play a straggler in tests of
// deadlines and of the federated-async staleness rules.

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/peer_agent/peer_hooks.h"

namespace shoal::testing {

// A peer::AfterBatchHook that waits `delay` on the host's wakeup (its clock) after every batch;
// the wait ends early when the batch's keep_going turns false (the wakeup is notified then), so
// a slow peer still stops at once. Null when `delay` is zero. INVALID_ARGUMENT starting with
// "--test-slow-batch" unless 0 <= delay <= 1 h.
absl::StatusOr<peer::AfterBatchHook> SlowBatchHook(absl::Duration delay);

}  // namespace shoal::testing
