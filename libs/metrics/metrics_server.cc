#include "libs/metrics/metrics_server.h"

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/status_macros.h"

namespace shoal::metrics {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    const std::string& flag) {
  SHOAL_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(listen, flag));
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": cannot listen on ", listen, ": ", e.what()));
  }
  auto ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat(flag, ": cannot listen on ", listen));
  }
  hp.port = ports.front();
  auto registry = std::make_shared<prometheus::Registry>();
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), std::move(registry), hp.ToString()));
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                             std::shared_ptr<prometheus::Registry> registry, std::string address)
    : registry_(std::move(registry)), exposer_(std::move(exposer)), address_(std::move(address)) {}

}  // namespace shoal::metrics
