// shoal-aggregator: the data-plane supernode. Receives peers' deltas as chunked streams,
// aggregates them per round or in a federated-async buffer with the task's strategy, and serves
// the aggregated model.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "libs/common/command_line.h"
#include "libs/common/log.h"
#include "libs/rpc/grpc_lifetime.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/signals.h"
#include "services/aggregator/aggregator_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7100", "HOST:PORT for gRPC (port 0 = any free port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9200",
          "HOST:PORT for Prometheus /metrics (port 0 = any free port)");
ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of the coordinator (required); HOST:PORT,HOST:PORT,...: several, and the "
          "aggregator registers with each one that serves (an active coordinator of its "
          "standbys, or every coordinator of --share-tasks)");
ABSL_FLAG(std::string, advertise, "",
          "HOST:PORT that peers and the coordinator use to reach this aggregator "
          "(default: the bound --listen address)");
ABSL_FLAG(std::string, address_file, "",
          "if set, write the bound addresses here (grpc=HOST:PORT, metrics=HOST:PORT)");
ABSL_FLAG(std::string, tls_dir, "",
          "mutual TLS: a directory with ca.crt, tls.crt, tls.key (see scripts/gen-certs)");
ABSL_FLAG(bool, insecure, false, "serve and call plaintext gRPC instead of mutual TLS");
ABSL_FLAG(int, max_concurrent_pushes, 4,
          "updates staged at once (each holds one model-sized buffer)");
ABSL_FLAG(uint64_t, max_buffer_bytes, uint64_t{4} << 30,
          "update memory one round or federated-async buffer may hold (a non-streaming "
          "strategy or a buffer holds K updates); more is refused with RESOURCE_EXHAUSTED");

ABSL_FLAG(uint64_t, upload_probe_bytes, uint64_t{4} << 20,
          "bytes of the timed upload to the coordinator that measures this aggregator's "
          "bandwidth (reported in its capacity; at most 64 MiB); 0 skips it");
ABSL_FLAG(std::string, host_peer, "",
          "set by shoal-peer --supernode when it starts this aggregator as an elected supernode: "
          "the peer's id, sent with every registration (not for use by hand)");

int main(int argc, char** argv) {
  shoal::rpc::BlockShutdownSignals();
  shoal::rpc::TuneAllocatorForModelStreams();
  shoal::SetLogProgramName("shoal-aggregator");
  shoal::ParseCommandLineOrExit(
      argc, argv,
      {.program = "shoal-aggregator",
       .usage = "--coordinator HOST:PORT[,HOST:PORT...] (--tls-dir DIR | --insecure) [--listen "
                "HOST:PORT] "
                "[--metrics-listen HOST:PORT] [--advertise HOST:PORT] [--address-file PATH] "
                "[--max-concurrent-pushes N] [--max-buffer-bytes BYTES] [--upload-probe-bytes N] "
                "[--host-peer ID]",
       .summary = "The Shoal aggregator: receives the peers' updates as chunked streams, "
                  "aggregates them with the task's strategy (per round, or in a federated-async "
                  "buffer) and serves the aggregated model."});

  shoal::aggregator::AggregatorOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.address_file = absl::GetFlag(FLAGS_address_file);
  options.max_concurrent_pushes = absl::GetFlag(FLAGS_max_concurrent_pushes);
  options.max_buffer_bytes = absl::GetFlag(FLAGS_max_buffer_bytes);
  options.upload_probe_bytes = absl::GetFlag(FLAGS_upload_probe_bytes);
  options.host_peer = absl::GetFlag(FLAGS_host_peer);
  options.tls.dir = absl::GetFlag(FLAGS_tls_dir);
  options.tls.insecure = absl::GetFlag(FLAGS_insecure);
  if (absl::Status s = options.Validate(); !s.ok()) {
    std::fprintf(stderr, "shoal-aggregator: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  shoal::rpc::GrpcLifetime grpc;  // outlives every gRPC object below (see its header)
  auto server = shoal::aggregator::AggregatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "shoal-aggregator: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const int sig = shoal::rpc::WaitForShutdownSignal();
  // sig 0: the process asked itself to stop (RequestShutdown), having said why.
  if (sig != 0) shoal::LogInfo("signal ", sig, ": shutting down");
  (*server)->Shutdown();
  server->reset();
  shoal::LogInfo("stopped");
  return grpc.Exit(0);
}
