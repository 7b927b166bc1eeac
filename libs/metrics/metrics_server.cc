#include "libs/metrics/metrics_server.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/heap.h"
#include "libs/common/status_macros.h"

namespace shoal::metrics {
namespace {

prometheus::MetricFamily Gauge(std::string name, std::string help, double value) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
  return family;
}

// The process's own figures, measured at each scrape.
void AppendProcessFamilies(std::vector<prometheus::MetricFamily>& families) {
  const HeapUse heap = MeasureHeap();
  families.push_back(Gauge("shoal_process_heap_in_use_bytes",
                           "Heap memory allocated and not freed (glibc mallinfo2).",
                           static_cast<double>(heap.in_use)));
  families.push_back(Gauge("shoal_process_heap_free_bytes",
                           "Free heap memory the allocator keeps for reuse instead of returning "
                           "it to the system (part of the resident set).",
                           static_cast<double>(heap.free)));
}

}  // namespace

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
    std::vector<prometheus::MetricFamily> families = registry->Collect();
    AppendProcessFamilies(families);
    res.set_content(prometheus::TextSerializer().Serialize(families),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  SHOAL_ASSIGN_OR_RETURN(s->listener_, http::Listener::Start(http, hp, flag));
  return s;
}

MetricsServer::~MetricsServer() = default;

}  // namespace shoal::metrics
