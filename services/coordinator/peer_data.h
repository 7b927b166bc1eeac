#pragma once

// TaskStatus.data: what each peer of a task trains on, from its DataReport. Pure functions over
// the status; the caller (CoordinatorCore) holds its lock.

#include <string>

#include "absl/status/status.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// At most this many classes in a label histogram.
inline constexpr int kMaxHistogramClasses = 65536;

// Records `report` as `peer_id`'s entry of status.data, replacing an older one; entries stay
// sorted by peer id. INVALID_ARGUMENT (nothing recorded) when the histogram is longer than
// kMaxHistogramClasses or does not sum to train_samples.
absl::Status RecordPeerData(v1::TaskStatus& status, const std::string& peer_id,
                            const v1::DataReport& report);

// Removes `peer_id`'s entry, if any.
void ForgetPeerData(v1::TaskStatus& status, const std::string& peer_id);

}  // namespace shoal::coordinator
