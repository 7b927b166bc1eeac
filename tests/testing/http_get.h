#pragma once

// Reading a service's Prometheus page in tests and benchmarks: plain HTTP/1.0 over a local
// socket, no client library.

#include <string>

#include "absl/status/statusor.h"

namespace shoal::testing {

// The body of GET http://address/path; address is HOST:PORT with a numeric IPv4 host.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// The value of the sample `name` (no labels) in a Prometheus text page; -1 when absent.
double MetricValue(const std::string& page, const std::string& name);

}  // namespace shoal::testing
