// MetricsServer over real HTTP on 127.0.0.1: the registry's metrics in Prometheus text format at
// /metrics, 404 elsewhere, a clear error for an address in use, and a stop that waits for nothing.

#include "libs/metrics/metrics_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <prometheus/counter.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/common/address.h"

namespace shoal::metrics {
namespace {

using ::testing::HasSubstr;

httplib::Client ClientOf(const MetricsServer& server) {
  absl::StatusOr<HostPort> hp = ParseHostPort(server.address(), "address");
  EXPECT_TRUE(hp.ok()) << hp.status();
  httplib::Client client(hp->host, hp->port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  return client;
}

TEST(MetricsServerTest, ServesTheRegistryInPrometheusTextFormat) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", "--metrics-listen");
  ASSERT_TRUE(server.ok()) << server.status();
  auto& family = prometheus::BuildCounter()
                     .Name("shoal_test_things_total")
                     .Help("things counted by the test")
                     .Register((*server)->registry());
  family.Add({{"kind", "a"}}).Increment(3);

  httplib::Client client = ClientOf(**server);
  for (int scrape = 0; scrape < 2; ++scrape) {  // one connection per scrape, both answered
    httplib::Result res = client.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
    EXPECT_THAT(res->body, HasSubstr("# TYPE shoal_test_things_total counter"));
    EXPECT_THAT(res->body, HasSubstr("shoal_test_things_total{kind=\"a\"} 3"));
  }
  httplib::Result other = client.Get("/");
  ASSERT_TRUE(other) << httplib::to_string(other.error());
  EXPECT_EQ(other->status, 404);
}

double GaugeIn(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + name.size() + 2));
}

// Every scrape also gives the process's heap: what is allocated (here it follows a 64 MiB
// allocation and its release) and the free memory the allocator keeps.
TEST(MetricsServerTest, ServesTheProcesssHeapInUseAsMeasuredAtTheScrape) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", "--metrics-listen");
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client = ClientOf(**server);
  auto scrape = [&](const std::string& name) {
    httplib::Result res = client.Get("/metrics");
    EXPECT_TRUE(res) << httplib::to_string(res.error());
    if (!res) return -1.0;
    EXPECT_THAT(res->body, HasSubstr("# TYPE " + name + " gauge"));
    return GaugeIn(res->body, name);
  };
  const double before = scrape("shoal_process_heap_in_use_bytes");
  ASSERT_GT(before, 0);
  EXPECT_GE(scrape("shoal_process_heap_free_bytes"), 0);
  constexpr size_t kBytes = size_t{64} << 20;
  auto block = std::make_unique<char[]>(kBytes);
  std::fill_n(block.get(), kBytes, 1);
  asm volatile("" : : "r"(block.get()) : "memory");  // the allocation is not optimised away
  const double holding = scrape("shoal_process_heap_in_use_bytes");
  EXPECT_GE(holding - before, static_cast<double>(kBytes));
  block.reset();
  EXPECT_LT(scrape("shoal_process_heap_in_use_bytes"), holding - static_cast<double>(kBytes) / 2);
}

TEST(MetricsServerTest, AnAddressInUseIsRefusedNamingTheFlag) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start("127.0.0.1:0", "--metrics-listen");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start((*first)->address(), "--metrics-listen");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr("--metrics-listen: cannot listen on " + (*first)->address()));
  EXPECT_FALSE(MetricsServer::Start("nonsense", "--metrics-listen").ok());
}

TEST(MetricsServerTest, StopsWithoutWaitingForAPollInterval) {
  // civetweb (under prometheus-cpp's Exposer) polls its listening socket in 2 s steps and stops
  // only at the end of one: right after a scrape, nearly 2 s on every service's exit.
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", "--metrics-listen");
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client = ClientOf(**server);
  ASSERT_TRUE(client.Get("/metrics"));
  const absl::Time start = absl::Now();
  server->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace shoal::metrics
