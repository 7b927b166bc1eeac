#pragma once

// Where a coordinator-less gossip peer learns the other members of its task: a static list (a
// dpwa YAML config) or a Kademlia DHT (dht_discovery.h). The static gossip peer
// (services/peer_agent/modes/gossip/static_gossip.h) talks to this interface only.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace shoal::discovery {

struct Member {
  std::string peer_id;
  std::string address;  // HOST:PORT of its PeerService
  bool operator==(const Member& o) const { return peer_id == o.peer_id && address == o.address; }
};

// The full member list, this peer included. Called on the discovery's own thread (or inside
// Start); must not block.
using MembersCallback = std::function<void(const std::vector<Member>&)>;

class Discovery {
 public:
  virtual ~Discovery() = default;
  // Makes `self` known to the others and calls `on_change` once at once with the members known
  // so far, then at every change, until Stop.
  virtual absl::Status Start(const Member& self, MembersCallback on_change) = 0;
  // Stops announcing and calling `on_change` (no call is running when it returns). Idempotent.
  virtual void Stop() = 0;
};

// A fixed member list (a dpwa YAML config's nodes): one call to `on_change` at Start.
class StaticDiscovery final : public Discovery {
 public:
  explicit StaticDiscovery(std::vector<Member> members) : members_(std::move(members)) {}
  absl::Status Start(const Member&, MembersCallback on_change) override {
    on_change(members_);
    return absl::OkStatus();
  }
  void Stop() override {}

 private:
  std::vector<Member> members_;
};

}  // namespace shoal::discovery
