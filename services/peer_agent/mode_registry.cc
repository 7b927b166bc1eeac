#include "services/peer_agent/mode_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"
#include "services/peer_agent/modes/federated_async/federated_async_runner.h"
#include "services/peer_agent/modes/federated_sync/federated_sync_runner.h"
#include "services/peer_agent/modes/gossip/gossip_runner.h"

namespace shoal::peer {
namespace {

// One line per mode, in the order of the Mode enum.
constexpr ModeEntry kModes[] = {
    {common::v1::MODE_FEDERATED_SYNC, &CreateFederatedSyncRunner},
    {common::v1::MODE_DECENTRALIZED, &CreateDecentralizedRunner},
    {common::v1::MODE_GOSSIP, &CreateGossipRunner},
    {common::v1::MODE_FEDERATED_ASYNC, &CreateFederatedAsyncRunner},
};

}  // namespace

absl::Span<const ModeEntry> RegisteredModes() { return kModes; }

const ModeEntry* FindMode(common::v1::Mode mode) {
  for (const ModeEntry& entry : kModes) {
    if (entry.mode == mode) return &entry;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<ModeRunner>> CreateModeRunner(ModeRunnerDeps deps) {
  const common::v1::Mode mode = deps.assigned.spec().mode();
  const ModeEntry* entry = FindMode(mode);
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("this peer cannot run mode ",
                                                   common::v1::Mode_Name(mode), " (",
                                                   static_cast<int>(mode), ")"));
  }
  return entry->create(std::move(deps));
}

}  // namespace shoal::peer
