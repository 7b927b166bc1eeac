#include "services/coordinator/mode_task.h"

#include "services/coordinator/decentralized_task.h"
#include "services/coordinator/gossip_task.h"

namespace shoal::coordinator {

std::unique_ptr<ModeTask> MakeModeTask(const v1::TaskStatus& status, CoordinatorMetrics& metrics) {
  switch (status.spec().mode()) {
    case common::v1::MODE_DECENTRALIZED:
      return std::make_unique<DecentralizedTask>(status, metrics);
    case common::v1::MODE_GOSSIP:
      return MakeGossipTask(status, metrics);
    default:
      return nullptr;  // federated-sync runs in CoordinatorCore itself
  }
}

}  // namespace shoal::coordinator
