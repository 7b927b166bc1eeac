#pragma once

// How much update memory a round or a federated-async buffer may hold (the aggregator's
// --max-buffer-bytes), and the messages that say why one was refused. Pure functions;
// thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "libs/aggregation/strategy.h"

namespace shoal::aggregator {

// "812 B", "1.6 KiB", "8.0 MiB", "4.0 GiB": a byte count for people (binary units, one decimal).
std::string HumanBytes(uint64_t bytes);

// A round of `strategy` with `updates` (K) expected updates of `model_bytes` each holds
// strategy.RoundMemoryBytes(K, model_bytes). RESOURCE_EXHAUSTED above `max_bytes`, e.g.
// "round 3 of task 't': median holds up to 5 updates × 1.6 MiB = 8.0 MiB, over this
// aggregator's --max-buffer-bytes 4.0 MiB". `what` names the round.
absl::Status CheckRoundMemory(const aggregation::Strategy& strategy, size_t updates,
                              uint64_t model_bytes, uint64_t max_bytes, absl::string_view what);

// A federated-async buffer holds up to `buffer_size` updates whatever the strategy (a peer's
// newer update replaces its older one, so none can be folded in early): buffer_size x
// model_bytes. RESOURCE_EXHAUSTED above `max_bytes`, e.g. "the buffer of task 't' (mean) holds up
// to 5 updates × 1.6 MiB = 8.0 MiB, over this aggregator's --max-buffer-bytes 4.0 MiB".
absl::Status CheckBufferMemory(const aggregation::Strategy& strategy, size_t buffer_size,
                               uint64_t model_bytes, uint64_t max_bytes, absl::string_view what);

}  // namespace shoal::aggregator
