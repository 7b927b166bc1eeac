#include "libs/metrics/metrics_server.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/status_macros.h"

namespace shoal::metrics {

MetricsServer::MetricsServer()
    : registry_(std::make_shared<prometheus::Registry>()),
      http_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    const std::string& flag) {
  SHOAL_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(listen, flag));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  httplib::Server& http = *s->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(1); };
  // One request per connection: an idle keep-alive connection would hold the one worker, and
  // the destructor would wait for it to time out.
  http.set_keep_alive_max_count(1);
  http.Get("/metrics", [registry = s->registry_](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(registry->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  SHOAL_ASSIGN_OR_RETURN(s->listener_, http::Listener::Start(http, hp, flag));
  return s;
}

MetricsServer::~MetricsServer() = default;

}  // namespace shoal::metrics
