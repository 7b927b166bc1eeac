#include "services/peer_agent/mode_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"
#include "services/peer_agent/modes/federated_async/federated_async_runner.h"
#include "services/peer_agent/modes/federated_sync/federated_sync_runner.h"
#include "services/peer_agent/modes/gossip/gossip_runner.h"

namespace shoal::peer {
namespace {

// One line per mode. A new mode adds its folder under modes/ and its line here.
constexpr ModeEntry kModes[] = {
    {common::v1::MODE_FEDERATED_SYNC, "federated-sync", &CreateFederatedSyncRunner},
    {common::v1::MODE_DECENTRALIZED, "decentralized", &CreateDecentralizedRunner},
    {common::v1::MODE_GOSSIP, "gossip", &CreateGossipRunner},
    {common::v1::MODE_FEDERATED_ASYNC, "federated-async", &CreateFederatedAsyncRunner},
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
