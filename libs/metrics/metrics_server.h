#pragma once

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::metrics {

// Serves one registry in Prometheus text format at http://HOST:PORT/metrics. Owns the exposer;
// the registry is shared with the components that register their metrics in it. Thread-safe.
class MetricsServer {
 public:
  // `listen` is HOST:PORT; port 0 picks a free port. `flag` names the flag in errors.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              const std::string& flag);

  prometheus::Registry& registry() { return *registry_; }
  // HOST:PORT actually bound.
  const std::string& address() const { return address_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                std::shared_ptr<prometheus::Registry> registry, std::string address);
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace shoal::metrics
