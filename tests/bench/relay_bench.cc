// Measures fetching a peer's snapshot through a relay (a peer behind NAT,
// docs/explanation/relays.md) against fetching it from the peer directly, in the same run, over
// 127.0.0.1 plaintext: one peer publishes an N MB round update; a GrpcPeerClient fetches it with
// PeerService.GetSnapshot from the peer's own server, and at RELAY/PEER_ID from an in-process
// relay (the aggregator's RelayService and relaying PeerService) to which the peer keeps its
// RelayLink stream open. Prints seconds and GB/s for each and the ratio relayed / direct, and
// how much the process's peak RSS grew with the first relayed fetch (what the relay held beyond
// what a direct fetch needs).
//
//   relay_bench [--mb 200] [--reps 5]

#include <prometheus/registry.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "libs/rpc/server.h"
#include "libs/tensor/flat_model.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/relay_hub.h"
#include "services/aggregator/relay_service.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/relay_link.h"
#include "services/peer_agent/snapshot_store.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "relay_bench: %s\n", what.c_str());
  std::exit(1);
}

double PeakRssMb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // KiB on Linux
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::unique_ptr<shoal::rpc::Server> Start(const std::string& name,
                                          std::vector<grpc::Service*> services) {
  shoal::rpc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.service_name = name;
  auto server = shoal::rpc::Server::Start(options, std::move(services));
  if (!server.ok()) Die(name + ": " + server.status().ToString());
  return *std::move(server);
}

}  // namespace

int main(int argc, char** argv) {
  int mb = 200;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--mb" && value > 0) {
      mb = value;
    } else if (flag == "--reps" && value > 0) {
      reps = value;
    } else {
      Die("usage: relay_bench [--mb N] [--reps N] (N > 0)");
    }
  }
  if (argc % 2 == 0) Die("usage: relay_bench [--mb N] [--reps N] (N > 0)");

  // The peer's round update: one tensor of mb MB.
  const int64_t elements = int64_t{mb} * 1000 * 1000 / 4;
  auto layout = shoal::tensor::ModelLayout::Create({{"w", {elements}}});
  if (!layout.ok()) Die(layout.status().ToString());
  auto model = std::make_shared<shoal::tensor::FlatModel>();
  model->layout = *layout;
  model->values.resize(static_cast<size_t>(elements));
  for (size_t i = 0; i < model->values.size(); ++i) model->values[i] = 0.001f * (i % 977);
  shoal::peer::SnapshotStore snapshots;
  snapshots.Publish({.task = "bench",
                     .version = 1,
                     .model = model,
                     .kind = shoal::peer::v1::SNAPSHOT_KIND_ROUND_UPDATE,
                     .round = 1,
                     .num_samples = 1});

  prometheus::Registry registry;
  shoal::peer::PeerMetrics peer_metrics(registry);
  shoal::aggregator::AggregatorMetrics relay_metrics(registry);
  shoal::peer::PeerServiceImpl peer_service(snapshots, peer_metrics);
  auto peer_server = Start("relay-bench-peer", {&peer_service});
  shoal::aggregator::RelayHub hub({}, relay_metrics);
  shoal::aggregator::RelayServiceImpl relay_service(hub);
  shoal::aggregator::RelayPeerServiceImpl relay_peer_service(hub);
  auto relay_server = Start("relay-bench-relay", {&relay_service, &relay_peer_service});
  shoal::peer::RelayLinkOptions link_options;
  link_options.relay = relay_server->address();
  link_options.peer_id = "peer-1";
  shoal::peer::RelayLink link(std::move(link_options), snapshots, peer_metrics);
  if (absl::Status s = link.WaitAttached(absl::Now() + absl::Seconds(20)); !s.ok()) {
    Die("relay link: " + s.ToString());
  }
  shoal::peer::GrpcPeerClient client(nullptr, &peer_metrics);

  auto fetch = [&](const std::string& address) {
    shoal::peer::v1::GetSnapshotRequest request;
    request.set_task("bench");
    request.set_peer_id("peer-0");
    request.set_kind(shoal::peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
    request.set_round(1);
    const auto start = Clock::now();
    auto got = client.Fetch(address, request, absl::Now() + absl::Seconds(300), *layout);
    if (!got.ok()) Die("GetSnapshot at " + address + ": " + got.status().ToString());
    if (got->model.values.size() != model->values.size()) Die("a fetch came back short");
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  const std::string relayed = relay_server->address() + "/peer-1";
  std::printf("snapshot: %d MB, %d reps, 127.0.0.1 plaintext\n", mb, reps);
  std::vector<double> direct_s, relayed_s, ratios;
  fetch(peer_server->address());  // warm-up: channels, allocator
  const double direct_peak = PeakRssMb();
  fetch(relayed);
  const double relayed_peak = PeakRssMb();
  for (int rep = 1; rep <= reps; ++rep) {
    const double d = fetch(peer_server->address());
    const double r = fetch(relayed);
    direct_s.push_back(d);
    relayed_s.push_back(r);
    ratios.push_back(r / d);
    std::printf("rep %d: direct %.3f s (%.2f GB/s), relayed %.3f s (%.2f GB/s), ratio %.2f\n", rep,
                d, mb / 1e3 / d, r, mb / 1e3 / r, r / d);
  }
  std::printf("\nmedians of %d reps\n", reps);
  std::printf("%-46s %8s %8s %6s\n", "path", "s", "GB/s", "ratio");
  std::printf("%-46s %8.3f %8.2f %6.2f\n", "GetSnapshot from the peer (direct)", Median(direct_s),
              mb / 1e3 / Median(direct_s), 1.0);
  std::printf("%-46s %8.3f %8.2f %6.2f\n", "GetSnapshot at RELAY/peer-1 (relayed)",
              Median(relayed_s), mb / 1e3 / Median(relayed_s), Median(ratios));
  std::printf("peak RSS: %.0f MB after a direct fetch, %.0f MB after a relayed one (+%.0f MB)\n",
              direct_peak, relayed_peak, relayed_peak - direct_peak);
  std::printf("RESULT direct_s=%.3f relayed_s=%.3f ratio=%.3f relay_peak_mb=%.0f\n",
              Median(direct_s), Median(relayed_s), Median(ratios), relayed_peak - direct_peak);
  relay_server->Shutdown(absl::Seconds(1));
  peer_server->Shutdown(absl::Seconds(1));
  return 0;
}
