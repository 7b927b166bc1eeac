#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "shoal/common/v1/capacity.pb.h"

namespace shoal::coordinator {

// The aggregators that registered with the coordinator (RegistryService) and when each last did.
// An aggregator silent for longer than the ttl, or one found gone (its watch stream broke), is
// forgotten until it registers again. Not thread-safe: CoordinatorCore holds it under its lock.
class AggregatorPool {
 public:
  struct Entry {
    absl::Time first_seen;
    absl::Time last_seen;
    // As the newest registration reported it; the reachability is the coordinator's dial-back.
    common::v1::Capacity capacity;
    // The name on its client certificate ("" without mutual TLS): its id as a child supernode
    // (a parent takes a child's partial sums only from that certificate).
    std::string identity;
    // An elected supernode: the peer that runs it ("" for a dedicated aggregator).
    std::string host_peer;
  };

  explicit AggregatorPool(absl::Duration ttl) : ttl_(ttl) {}

  // Records a registration; true when the aggregator was not known. The reachability found
  // before is kept.
  bool Register(const std::string& address, const common::v1::Capacity& capacity,
                const std::string& identity, const std::string& host_peer, absl::Time now);
  // Forgets the aggregators silent since before now - ttl; returns them.
  std::vector<std::string> Expire(absl::Time now);
  void Remove(const std::string& address) { seen_.erase(address); }
  bool Has(const std::string& address) const { return seen_.count(address) > 0; }
  // nullptr when not registered.
  Entry* Find(const std::string& address);
  const Entry* Find(const std::string& address) const;
  const std::map<std::string, Entry>& entries() const { return seen_; }
  size_t size() const { return seen_.size(); }
  // The registered aggregator for a new task: one the coordinator did not find unreachable,
  // with the fewest tasks in `load` (address -> tasks), then well connected (host_rank.h: an
  // upload at least half the best one's), then the most compute (cores x the matrix-multiply
  // score), then the fastest upload, then the first by address; "" when none is registered.
  // Skips the addresses in `exclude`.
  std::string Pick(const std::map<std::string, size_t>& load,
                   const std::set<std::string>& exclude = {}) const;

 private:
  const absl::Duration ttl_;
  std::map<std::string, Entry> seen_;
};

}  // namespace shoal::coordinator
