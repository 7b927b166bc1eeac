#include "libs/capacity/aggregator_rtt.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/rpc/channel.h"

namespace shoal::capacity {
namespace {

// One health check before `deadline`; its round trip, or nullopt when it failed.
std::optional<absl::Duration> Check(grpc::health::v1::Health::Stub& stub, absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const auto start = std::chrono::steady_clock::now();
  if (!stub.Check(&context, request, &response).ok()) return std::nullopt;
  return absl::FromChrono(std::chrono::steady_clock::now() - start);
}

std::optional<absl::Duration> Measure(const std::string& address,
                                      const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                      absl::Duration timeout, int probes) {
  const absl::Time deadline = absl::Now() + timeout;
  auto stub = grpc::health::v1::Health::NewStub(rpc::MakeProbeChannel(address, credentials));
  // The first check pays for the connection (TCP, TLS): a reachability check, not a sample.
  if (!Check(*stub, deadline).has_value()) return std::nullopt;
  std::optional<absl::Duration> best;
  for (int i = 0; i < probes; ++i) {
    const std::optional<absl::Duration> rtt = Check(*stub, deadline);
    if (rtt.has_value() && (!best.has_value() || *rtt < *best)) best = rtt;
  }
  return best;
}

}  // namespace

std::vector<common::v1::AggregatorRtt> MeasureAggregatorRtts(
    const std::vector<std::string>& addresses,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials, absl::Duration timeout,
    int probes) {
  const size_t n = std::min(addresses.size(), kMaxAggregatorRtts);
  std::vector<std::optional<absl::Duration>> results(n);
  {
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back(
          [&, i] { results[i] = Measure(addresses[i], credentials, timeout, probes); });
    }
    for (std::thread& t : threads) t.join();
  }
  std::vector<common::v1::AggregatorRtt> rtts;
  for (size_t i = 0; i < n; ++i) {
    if (!results[i].has_value()) continue;
    common::v1::AggregatorRtt& rtt = rtts.emplace_back();
    rtt.set_address(addresses[i]);
    rtt.set_rtt_us(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Microseconds(*results[i]), 1, UINT32_MAX)));
  }
  return rtts;
}

}  // namespace shoal::capacity
