// The modes this coordinator runs: one line per mode (services/coordinator/modes/<mode>/).

#include <memory>

#include "services/coordinator/mode_task.h"
#include "services/coordinator/modes/decentralized/decentralized_task.h"
#include "services/coordinator/modes/federated_async/federated_async_task.h"
#include "services/coordinator/modes/federated_sync/federated_sync_task.h"
#include "services/coordinator/modes/gossip/gossip_task.h"

namespace shoal::coordinator {

std::unique_ptr<ModeTask> MakeModeTask(const v1::TaskStatus& status, const ModeOptions& options,
                                       CoordinatorMetrics& metrics) {
  switch (status.spec().mode()) {
    case common::v1::MODE_FEDERATED_SYNC:
      return std::make_unique<FederatedSyncTask>(status, options, metrics);
    case common::v1::MODE_FEDERATED_ASYNC:
      return std::make_unique<FederatedAsyncTask>(status, options, metrics);
    case common::v1::MODE_DECENTRALIZED:
      return std::make_unique<DecentralizedTask>(status, metrics, options.final_eval_timeout);
    case common::v1::MODE_GOSSIP:
      return MakeGossipTask(status, metrics);
    default:
      return nullptr;
  }
}

}  // namespace shoal::coordinator
