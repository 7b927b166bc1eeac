#include "services/coordinator/aggregator_pool.h"

#include <cstdint>

namespace shoal::coordinator {

bool AggregatorPool::Register(const std::string& address, absl::Time now) {
  const bool fresh = seen_.count(address) == 0;
  seen_[address] = now;
  return fresh;
}

std::vector<std::string> AggregatorPool::Expire(absl::Time now) {
  std::vector<std::string> expired;
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (now - it->second > ttl_) {
      expired.push_back(it->first);
      it = seen_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

std::string AggregatorPool::Pick(const std::map<std::string, size_t>& load) const {
  std::string best;
  size_t best_load = SIZE_MAX;
  for (const auto& [address, seen] : seen_) {
    auto it = load.find(address);
    const size_t n = it == load.end() ? 0 : it->second;
    if (n < best_load) {
      best = address;
      best_load = n;
    }
  }
  return best;
}

}  // namespace shoal::coordinator
