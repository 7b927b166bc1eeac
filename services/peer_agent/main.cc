// shoal-peer: a peer agent. Flags -> PeerOptions -> PeerServer -> run until SIGTERM.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/flag_names.h"
#include "libs/common/log.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/signals.h"
#include "libs/training/partition.h"
#include "services/peer_agent/peer_server.h"

ABSL_FLAG(std::string, coordinator, "", "HOST:PORT of the coordinator (required)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT for this peer's PeerService");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0", "HOST:PORT for Prometheus /metrics");
ABSL_FLAG(std::string, data_dir, "",
          "directory with the Fashion-MNIST .gz files, e.g. /usr/share/datasets/fashion-mnist "
          "(required)");
ABSL_FLAG(std::string, shard, "", "this peer's data shard I/N, 0 <= I < N (required)");
ABSL_FLAG(std::string, name, "", "peer id to ask for (default: the coordinator picks one)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, address_file, "",
          "write the bound addresses here (grpc=HOST:PORT, metrics=HOST:PORT)");
ABSL_FLAG(int, torch_threads, 1, "LibTorch intra-op threads");
ABSL_FLAG(std::string, tls_dir, "",
          "mutual TLS: a directory with ca.crt, tls.crt, tls.key (see scripts/gen-certs)");
ABSL_FLAG(bool, insecure, false, "serve and call plaintext gRPC instead of mutual TLS");
ABSL_FLAG(std::string, join_token, "",
          "the join token of the tasks to join (default: $SHOAL_JOIN_TOKEN); prefer the "
          "environment variable, command lines are visible to other users");

namespace {

[[noreturn]] void Fail(const absl::Status& status, int code) {
  shoal::LogError(status.message());
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  shoal::rpc::BlockShutdownSignals();
  shoal::rpc::TuneAllocatorForModelStreams();
  shoal::SetLogProgramName("shoal-peer");
  absl::SetProgramUsageMessage(
      "shoal-peer --coordinator HOST:PORT --listen HOST:PORT --metrics-listen HOST:PORT "
      "--data-dir DIR --shard I/N [--name ID] [--device cpu|cuda] [--address-file PATH] "
      "[--torch-threads N] (--tls-dir DIR | --insecure)");
  std::vector<std::string> rest = shoal::ParseDashedCommandLine(argc, argv);
  if (rest.size() > 1) {
    Fail(absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", rest[1], "\"")), 2);
  }

  shoal::peer::PeerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.name = absl::GetFlag(FLAGS_name);
  options.device = absl::GetFlag(FLAGS_device);
  options.address_file = absl::GetFlag(FLAGS_address_file);
  options.torch_threads = absl::GetFlag(FLAGS_torch_threads);
  options.tls.dir = absl::GetFlag(FLAGS_tls_dir);
  options.tls.insecure = absl::GetFlag(FLAGS_insecure);
  options.join_token = absl::GetFlag(FLAGS_join_token);
  if (const char* token = std::getenv("SHOAL_JOIN_TOKEN");
      options.join_token.empty() && token != nullptr) {
    options.join_token = token;
  }
  const std::string shard = absl::GetFlag(FLAGS_shard);
  if (shard.empty()) Fail(absl::InvalidArgumentError("--shard is required (I/N)"), 2);
  absl::StatusOr<shoal::training::ShardSpec> parsed =
      shoal::training::ParseShardSpec(shard, "--shard");
  if (!parsed.ok()) Fail(parsed.status(), 2);
  options.shard = *parsed;
  if (absl::Status s = options.Validate(); !s.ok()) Fail(s, 2);

  absl::StatusOr<std::unique_ptr<shoal::peer::PeerServer>> server =
      shoal::peer::PeerServer::Start(options);
  if (!server.ok()) {
    const absl::StatusCode code = server.status().code();
    Fail(server.status(),
         code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ? 2 : 1);
  }
  return (*server)->Run();
}
