#pragma once

// Who a coordinator-less gossip peer is and where it learns the other members from: the node
// list of a dpwa YAML config (--dpwa-config, --dpwa-node) or a Kademlia DHT (--dht-listen,
// --dht-bootstrap, signed with the peer's TLS key). The one place that branches on the two.

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "libs/discovery/discovery.h"
#include "libs/rpc/tls.h"
#include "libs/training/partition.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::peer {

struct GossipMembershipOptions {
  std::string dpwa_config;    // --dpwa-config
  std::string node;           // --dpwa-node
  std::string dht_listen;     // --dht-listen HOST:PORT
  std::string dht_bootstrap;  // --dht-bootstrap HOST:PORT[,HOST:PORT...]
  int dht_min_members = 2;    // --dht-min-members
  rpc::TlsOptions tls;        // the DHT's announcements are signed with --tls-dir's key
};

struct GossipMembership {
  std::string peer_id;
  std::string listen;                            // the default --listen
  training::ShardSpec shard;                     // the default --shard
  std::optional<common::v1::GossipSpec> gossip;  // the dpwa config's settings, if any
  // Training starts once this many members (this peer included) are known: 1 with a dpwa
  // config (all are known at once), --dht-min-members with the DHT.
  size_t start_members = 1;
  std::unique_ptr<discovery::Discovery> discovery;
  std::string dht_address;  // the bound DHT node ("" without DHT), for --address-file
  std::string source;       // for the log: the dpwa file, or "DHT on HOST:PORT"
};

// `task` is the task file's name (the DHT key). Errors: INVALID_ARGUMENT / NOT_FOUND naming the
// flag or the file and key at fault; UNAVAILABLE when the DHT port cannot be bound.
absl::StatusOr<GossipMembership> MakeGossipMembership(const GossipMembershipOptions& options,
                                                      const std::string& task);

}  // namespace shoal::peer
