#include "services/coordinator/aggregator_pool.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "services/coordinator/host_rank.h"

namespace shoal::coordinator {

bool AggregatorPool::Register(const std::string& address, const common::v1::Capacity& capacity,
                              const std::string& identity, const std::string& host_peer,
                              absl::Time now) {
  auto [it, fresh] = seen_.try_emplace(address);
  Entry& entry = it->second;
  if (fresh) entry.first_seen = now;
  entry.last_seen = now;
  const common::v1::Reachability reachability = entry.capacity.reachability();
  entry.capacity = capacity;
  entry.identity = identity;
  entry.host_peer = host_peer;
  entry.capacity.set_reachability(fresh ? common::v1::REACHABILITY_UNKNOWN : reachability);
  return fresh;
}

AggregatorPool::Entry* AggregatorPool::Find(const std::string& address) {
  auto it = seen_.find(address);
  return it == seen_.end() ? nullptr : &it->second;
}

const AggregatorPool::Entry* AggregatorPool::Find(const std::string& address) const {
  auto it = seen_.find(address);
  return it == seen_.end() ? nullptr : &it->second;
}

std::vector<std::string> AggregatorPool::Expire(absl::Time now) {
  std::vector<std::string> expired;
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (now - it->second.last_seen > ttl_) {
      expired.push_back(it->first);
      it = seen_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

std::string AggregatorPool::Pick(const std::map<std::string, size_t>& load,
                                 const std::set<std::string>& exclude) const {
  // Best first: not found unreachable, fewest tasks, well connected, most compute, fastest
  // upload, address.
  double best_upload = 0;
  for (const auto& [address, entry] : seen_) {
    if (exclude.count(address) == 0 &&
        entry.capacity.reachability() != common::v1::REACHABILITY_UNREACHABLE) {
      best_upload = std::max(best_upload, entry.capacity.upload_bytes_per_second());
    }
  }
  auto key = [&](const std::string& address, const Entry& e) {
    auto it = load.find(address);
    const common::v1::Capacity& c = e.capacity;
    return std::make_tuple(c.reachability() == common::v1::REACHABILITY_UNREACHABLE,
                           it == load.end() ? size_t{0} : it->second,
                           !WellConnected(c, best_upload), -Compute(c),
                           -c.upload_bytes_per_second());
  };
  const std::string* best = nullptr;
  for (const auto& [address, entry] : seen_) {
    if (exclude.count(address) > 0) continue;
    if (best == nullptr || key(address, entry) < key(*best, seen_.at(*best))) best = &address;
  }
  return best == nullptr ? std::string() : *best;
}

}  // namespace shoal::coordinator
