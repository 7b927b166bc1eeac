#pragma once

// Test-only slow peer (shoal-peer --test-slow-batch MS): every training batch takes MS
// milliseconds longer, in every mode, to play a straggler in tests of deadlines and of the
// federated-async staleness rules.

#include <functional>

#include "absl/time/time.h"
#include "libs/rpc/retry.h"

namespace shoal::peer {

// A training::TrainerOptions::after_batch that waits `delay` on `wakeup`'s clock after every
// batch; the wait ends early when the batch's keep_going turns false (the wakeup is notified
// then), so a slow peer still stops at once. Null when `delay` is not positive. `wakeup` must
// outlive every trainer that uses it.
std::function<void(const std::function<bool()>& keep_going)> SlowBatchPause(
    absl::Duration delay, const rpc::Wakeup& wakeup);

}  // namespace shoal::peer
