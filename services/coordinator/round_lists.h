#pragma once

#include <cstddef>
#include <cstdint>

#include "google/protobuf/repeated_ptr_field.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

// A round's per-peer lists (participants, dropped, late, peer_times) grow with its peers: at
// 10,000 peers a round carries about 0.3 MB of them, and a status with 100 such rounds would pass
// every client's message limit. What the coordinator sends carries at most this many list
// entries: the newest rounds in full, the older ones with their counts only.
inline constexpr size_t kRoundListBudget = 50'000;

// Entries in `round`'s per-peer lists.
size_t ListEntries(const v1::RoundSummary& round);

// Sets `to`'s counts (participant_count, ...) from `from`'s lists.
void SetCounts(const v1::RoundSummary& from, v1::RoundSummary& to);

// Appends copies of `rounds` (oldest first) to `out`, each with its counts set. The newest rounds
// keep their lists while the total fits in `budget` entries; that round and every older one
// are copied without them (lists_omitted).
void AppendRounds(const google::protobuf::RepeatedPtrField<v1::RoundSummary>& rounds, size_t budget,
                  google::protobuf::RepeatedPtrField<v1::RoundSummary>* out);

// The rounds a task has completed: its model version, or the newest version its history shows
// (a restored status may carry history past it).
uint64_t CompletedRounds(const v1::TaskStatus& status);

}  // namespace shoal::coordinator
