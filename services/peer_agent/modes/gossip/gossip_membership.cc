#include "services/peer_agent/modes/gossip/gossip_membership.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/common/status_macros.h"
#include "libs/discovery/announcement.h"
#include "libs/discovery/dht_discovery.h"
#include "libs/gossip/dpwa_config.h"
#include "services/peer_agent/flag_error.h"

namespace shoal::peer {
namespace {

absl::StatusOr<GossipMembership> FromDpwaConfig(const GossipMembershipOptions& options) {
  if (options.node.empty()) return absl::InvalidArgumentError("--dpwa-node is required");
  absl::StatusOr<gossip::DpwaConfig> config = gossip::LoadDpwaConfig(options.dpwa_config);
  if (!config.ok()) return FlagError("--dpwa-config", config.status());
  const gossip::DpwaNode* me = config->Find(options.node);
  if (me == nullptr) {
    std::vector<std::string> names;
    for (const auto& n : config->nodes) names.push_back(n.name);
    return absl::InvalidArgumentError(absl::StrCat("--dpwa-node: no node \"", options.node,
                                                   "\" in ", options.dpwa_config,
                                                   " (nodes: ", absl::StrJoin(names, ", "), ")"));
  }
  size_t index = 0;
  while (config->nodes[index].name != me->name) ++index;
  GossipMembership m;
  m.peer_id = me->name;
  m.listen = me->address();
  m.shard = {static_cast<uint32_t>(index), static_cast<uint32_t>(config->nodes.size())};
  m.gossip = config->gossip;
  std::vector<discovery::Member> members;
  for (const gossip::DpwaNode& n : config->nodes) members.push_back({n.name, n.address()});
  m.discovery = std::make_unique<discovery::StaticDiscovery>(std::move(members));
  m.source = options.dpwa_config;
  return m;
}

absl::StatusOr<GossipMembership> FromDht(const GossipMembershipOptions& options,
                                         const std::string& task) {
  if (options.dht_min_members < 1 || options.dht_min_members > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dht-min-members: must be in [1, 100000], got ", options.dht_min_members));
  }
  if (options.tls.insecure || options.tls.dir.empty()) {
    return absl::InvalidArgumentError(
        "--dht-listen needs --tls-dir: announcements are signed with the peer's TLS key and "
        "checked against its CA");
  }
  SHOAL_ASSIGN_OR_RETURN(rpc::TlsFiles files, rpc::LoadTlsFiles(options.tls.dir));
  absl::StatusOr<discovery::AnnouncementSigner> signer =
      discovery::AnnouncementSigner::Create(files.cert, files.key);
  if (!signer.ok()) return FlagError("--tls-dir", signer.status());
  absl::StatusOr<discovery::AnnouncementVerifier> verifier =
      discovery::AnnouncementVerifier::Create(files.ca);
  if (!verifier.ok()) return FlagError("--tls-dir", verifier.status());
  discovery::DhtOptions dht;
  dht.listen = options.dht_listen;
  dht.task = task;
  for (absl::string_view b : absl::StrSplit(options.dht_bootstrap, ',', absl::SkipEmpty())) {
    dht.bootstrap.emplace_back(b);
  }
  GossipMembership m;
  m.peer_id = signer->peer_id();
  m.listen = "127.0.0.1:0";  // --listen's default; its bound address is what is announced
  m.shard = {0, 1};
  m.start_members = static_cast<size_t>(options.dht_min_members);
  SHOAL_ASSIGN_OR_RETURN(
      std::unique_ptr<discovery::DhtDiscovery> d,
      discovery::DhtDiscovery::Create(dht, *std::move(signer), *std::move(verifier)));
  m.dht_address = d->address();
  m.source = "DHT on " + d->address();
  m.discovery = std::move(d);
  return m;
}

}  // namespace

absl::StatusOr<GossipMembership> MakeGossipMembership(const GossipMembershipOptions& options,
                                                      const std::string& task) {
  const bool dpwa = !options.dpwa_config.empty();
  const bool dht = !options.dht_listen.empty();
  if (dpwa == dht) {
    return absl::InvalidArgumentError(dpwa ? "--dpwa-config and --dht-listen exclude each other"
                                           : "--dpwa-config or --dht-listen is required");
  }
  if (!options.dht_bootstrap.empty() && !dht) {
    return absl::InvalidArgumentError("--dht-bootstrap needs --dht-listen");
  }
  if (dht && !options.node.empty()) {
    return absl::InvalidArgumentError(
        "--dpwa-node goes with --dpwa-config; with --dht-listen the peer id is the TLS "
        "certificate's common name");
  }
  return dpwa ? FromDpwaConfig(options) : FromDht(options, task);
}

}  // namespace shoal::peer
