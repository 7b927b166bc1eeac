#pragma once

#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/http/listener.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace shoal::metrics {

// Serves one registry in Prometheus text format at http://HOST:PORT/metrics (cpp-httplib, one
// worker thread, a connection per scrape). The registry is shared with the components that
// register their metrics in it. Thread-safe. The destructor stops serving at once: a scrape in
// progress is finished, nothing waits on a poll interval.
class MetricsServer {
 public:
  // `listen` is HOST:PORT; port 0 picks a free port. `flag` names the flag in errors.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              const std::string& flag);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  // HOST:PORT actually bound.
  const std::string& address() const { return listener_.address(); }

 private:
  MetricsServer();
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> http_;
  http::Listener listener_;  // stopped first
};

}  // namespace shoal::metrics
