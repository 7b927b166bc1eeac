#pragma once

// One-line registration of a Prometheus metric in a registry, for the services' metrics structs.

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <string>

namespace shoal::metrics {

using Labels = std::map<std::string, std::string>;

inline prometheus::Counter& Counter(prometheus::Registry& r, const std::string& name,
                                    const std::string& help, const Labels& labels = {}) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

inline prometheus::Gauge& Gauge(prometheus::Registry& r, const std::string& name,
                                const std::string& help, const Labels& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

inline prometheus::Histogram& Histogram(prometheus::Registry& r, const std::string& name,
                                        const std::string& help,
                                        prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

}  // namespace shoal::metrics
