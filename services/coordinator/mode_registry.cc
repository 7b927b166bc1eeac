// The modes this coordinator runs: a table, one line per mode (each mode's folder under
// services/coordinator/modes/ defines its factory).

#include <memory>

#include "absl/types/span.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/modes/decentralized/decentralized_task.h"
#include "services/coordinator/modes/federated_async/federated_async_task.h"
#include "services/coordinator/modes/federated_sync/federated_sync_task.h"
#include "services/coordinator/modes/gossip/gossip_task.h"

namespace shoal::coordinator {
namespace {

// One line per mode, in the order of the Mode enum.
constexpr CoordinatorMode kModes[] = {
    {common::v1::MODE_FEDERATED_SYNC, &MakeFederatedSyncTask},
    {common::v1::MODE_DECENTRALIZED, &MakeDecentralizedTask},
    {common::v1::MODE_GOSSIP, &MakeGossipTask},
    {common::v1::MODE_FEDERATED_ASYNC, &MakeFederatedAsyncTask},
};

}  // namespace

absl::Span<const CoordinatorMode> RegisteredModes() { return kModes; }

std::unique_ptr<ModeTask> MakeModeTask(const v1::TaskStatus& status, const ModeOptions& options,
                                       CoordinatorMetrics& metrics) {
  for (const CoordinatorMode& mode : kModes) {
    if (mode.mode == status.spec().mode()) return mode.create(status, options, metrics);
  }
  return nullptr;
}

}  // namespace shoal::coordinator
