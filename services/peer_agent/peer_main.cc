#include "services/peer_agent/peer_main.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/command_line.h"
#include "libs/common/log.h"
#include "libs/rpc/grpc_lifetime.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/pacer.h"
#include "libs/rpc/signals.h"
#include "libs/training/partition.h"
#include "services/peer_agent/modes/gossip/static_gossip.h"
#include "services/peer_agent/peer_server.h"

ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of the coordinator (required); HOST:PORT,HOST:PORT,...: an active "
          "coordinator and its standbys, tried in turn when one does not serve");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT for this peer's PeerService");
ABSL_FLAG(std::string, advertise, "",
          "HOST:PORT other peers reach this peer's PeerService at, sent to the coordinator "
          "(default: the address it listens on; set it behind NAT or port forwarding)");
ABSL_FLAG(std::string, relay, "",
          "HOST:PORT of an aggregator that relays for this peer when it accepts no inbound "
          "connection (behind NAT): the peer keeps one stream open to it and is advertised as "
          "HOST:PORT/NAME; needs --name, excludes --advertise. \"auto\": the coordinator "
          "picks the aggregator (and the id, without --name). Unset (the default): the "
          "coordinator dials the peer back, and picks a relay for it when that fails. "
          "\"off\": never relayed");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0", "HOST:PORT for Prometheus /metrics");
ABSL_FLAG(std::string, data_dir, "",
          "this peer's data (required): the Fashion-MNIST .gz files (e.g. "
          "/usr/share/datasets/fashion-mnist), and the files a task's dataset names (formats "
          "idx, csv, image-folder: relative paths are read from here)");
ABSL_FLAG(std::string, model_dir, "",
          "where the TorchScript files of tasks with model {torchscript: FILE} are: a relative "
          "FILE is read from here (default: the working directory; with --dpwa-config: the task "
          "file's directory). Each file must be identical to the one the task was created with "
          "(its SHA-256 is checked)");
ABSL_FLAG(std::string, scratch_dir, "",
          "where a federated peer keeps the global model on disk while it trains (an unnamed "
          "file, gone when the peer exits), so that its memory holds only LibTorch's "
          "parameters, gradients and momentum, and where a decentralized peer's round updates "
          "wait for their turn beyond 64 MiB of them in memory; keep it on a disk, not a tmpfs "
          "(default: $TMPDIR, else /tmp)");
ABSL_FLAG(std::string, state_dir, "",
          "where this peer keeps what a restart must not lose (made if missing): in each "
          "decentralized task, the model of the last round it completed (one model file per "
          "task, replaced each round, removed when the task finishes; of tasks it left, the three "
          "written last are kept). A peer started again "
          "with the same --state-dir holds that model again, so a task whose peers "
          "all restarted goes on from that round instead of losing its model. Default: keep "
          "nothing");
ABSL_FLAG(bool, evaluate_beside_training, true,
          "federated-sync: evaluate each published model on a thread of its own beside the next "
          "round, off the round's critical path (it pauses, holding no model, while the peer "
          "trains and pushes; peak memory about 3x the model either way). "
          "false: evaluate it before the next round trains, as part of that round's time");
ABSL_FLAG(bool, download_against_held, false,
          "federated modes: a download of the global model names the version this peer holds, "
          "so the aggregator sends it as the XOR with that version, deflated: fewer bytes for a "
          "peer behind a slow link (a quarter fewer on the CNN, 20x fewer with top-k updates), "
          "at the cost of a zlib pass at both ends, which slows rounds over fast links");
ABSL_FLAG(std::string, shard, "",
          "train on shard I/N (0 <= I < N) of the data in --data-dir, as every peer with the "
          "same files splits it (an experiment); default: all of --data-dir's data is this "
          "peer's own");
ABSL_FLAG(std::string, name, "", "peer id to ask for (default: the coordinator picks one)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, address_file, "",
          "write the bound addresses here (grpc=HOST:PORT, metrics=HOST:PORT)");
ABSL_FLAG(int, torch_threads, 1, "LibTorch intra-op threads");
ABSL_FLAG(uint64_t, upload_probe_bytes, uint64_t{4} << 20,
          "bytes of the timed upload to the coordinator that measures this peer's bandwidth "
          "(reported in its capacity; at most 64 MiB); 0 skips it");
ABSL_FLAG(std::string, serve_pacing, "auto",
          "the snapshots this peer serves other peers (decentralized and gossip) go out at its "
          "uplink's rate rather than as fast as TCP takes them, so that its router's queue stays "
          "short and what it downloads meanwhile is not slowed: auto paces at the upload "
          "measured (--upload-probe-bytes) where that is under 200 Mbit/s, and not otherwise "
          "(nor without a coordinator); off never paces; a number paces at that many Mbit/s");
ABSL_FLAG(std::string, tls_dir, "",
          "mutual TLS: a directory with ca.crt, tls.crt, tls.key (see scripts/gen-certs)");
ABSL_FLAG(bool, insecure, false, "serve and call plaintext gRPC instead of mutual TLS");
ABSL_FLAG(std::string, join_token, "",
          "the join token of the tasks to join (default: $SHOAL_JOIN_TOKEN); prefer the "
          "environment variable, command lines are visible to other users");

ABSL_FLAG(bool, supernode, false,
          "offer to host an elected supernode: when the coordinator elects this peer (by capacity, "
          "for hierarchical tasks), it runs shoal-aggregator as its child process");
ABSL_FLAG(std::string, supernode_binary, "",
          "with --supernode: the shoal-aggregator executable (default: next to this binary)");
ABSL_FLAG(std::string, supernode_listen, "",
          "with --supernode: HOST:PORT for the aggregator's gRPC (default: --listen's host, port "
          "0 = any free port)");
ABSL_FLAG(std::string, supernode_advertise, "",
          "with --supernode: HOST:PORT that peers and the coordinator use to reach the aggregator "
          "(default: its bound address)");
// Static gossip membership without a coordinator (modes/gossip/static_gossip.h).
ABSL_FLAG(std::string, dpwa_config, "",
          "gossip without a coordinator: dpwa's YAML config (nodes, fetch_probability, ...); "
          "needs --dpwa-node and --task-file");
ABSL_FLAG(std::string, dpwa_node, "", "with --dpwa-config: this peer's node name in the config");
ABSL_FLAG(std::string, dht_listen, "",
          "gossip without a coordinator, members found through a Kademlia DHT: HOST:PORT (UDP) "
          "of this peer's DHT node (port 0: any); needs --task-file and --tls-dir (announcements "
          "are signed with its key; the peer id is its certificate's common name)");
ABSL_FLAG(std::string, dht_bootstrap, "",
          "with --dht-listen: HOST:PORT[,HOST:PORT...] of DHT nodes already running (any other "
          "peer's --dht-listen); none for the first peer");
ABSL_FLAG(int, dht_min_members, 2,
          "with --dht-listen: start training once this many members of the task (this peer "
          "included) are known; until then wait");
ABSL_FLAG(std::string, task_file, "",
          "with --dpwa-config or --dht-listen: the task file (model, data, optimizer, rounds x "
          "round_batches steps); a dpwa config's gossip settings override the task's");
ABSL_FLAG(std::string, final_model_out, "",
          "with --dpwa-config or --dht-listen: write the final model to this file when done");
ABSL_FLAG(std::string, report_out, "",
          "with --dpwa-config or --dht-listen: write a JSON summary (accuracy, fetches, bytes) "
          "here when done");
ABSL_FLAG(bool, exit_when_done, false,
          "with --dpwa-config or --dht-listen: exit when done instead of serving the final model "
          "until stopped");

namespace shoal::peer {
namespace {

[[noreturn]] void Fail(const absl::Status& status, int code) {
  LogError(status.message());
  std::exit(code);
}

// --serve-pacing, or exit 2 naming it.
rpc::PacingSetting ServePacingFlag() {
  absl::StatusOr<rpc::PacingSetting> pacing =
      rpc::PacingSetting::Parse(absl::GetFlag(FLAGS_serve_pacing));
  if (!pacing.ok()) Fail(pacing.status(), 2);
  return *pacing;
}

int RunStaticGossip(const PeerHooks& hooks) {
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    Fail(
        absl::InvalidArgumentError(
            "--coordinator excludes --dpwa-config and --dht-listen (gossip without a coordinator)"),
        2);
  }
  StaticGossipOptions options;
  options.dpwa_config = absl::GetFlag(FLAGS_dpwa_config);
  options.node = absl::GetFlag(FLAGS_dpwa_node);
  options.dht_listen = absl::GetFlag(FLAGS_dht_listen);
  options.dht_bootstrap = absl::GetFlag(FLAGS_dht_bootstrap);
  options.dht_min_members = absl::GetFlag(FLAGS_dht_min_members);
  options.task_file = absl::GetFlag(FLAGS_task_file);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  // The default --listen means "the node's host:port from the config".
  if (absl::GetFlag(FLAGS_listen) != "127.0.0.1:0") options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.address_file = absl::GetFlag(FLAGS_address_file);
  options.device = absl::GetFlag(FLAGS_device);
  options.torch_threads = absl::GetFlag(FLAGS_torch_threads);
  options.tls.dir = absl::GetFlag(FLAGS_tls_dir);
  options.tls.insecure = absl::GetFlag(FLAGS_insecure);
  options.final_model_out = absl::GetFlag(FLAGS_final_model_out);
  options.report_out = absl::GetFlag(FLAGS_report_out);
  options.exit_when_done = absl::GetFlag(FLAGS_exit_when_done);
  options.serve_pacing = ServePacingFlag();
  options.hooks = hooks;
  if (const std::string shard = absl::GetFlag(FLAGS_shard); !shard.empty()) {
    absl::StatusOr<training::ShardSpec> parsed = training::ParseShardSpec(shard, "--shard");
    if (!parsed.ok()) Fail(parsed.status(), 2);
    options.shard = *parsed;
  }
  absl::StatusOr<std::unique_ptr<StaticGossipPeer>> peer = StaticGossipPeer::Start(options);
  if (!peer.ok()) {
    const absl::StatusCode code = peer.status().code();
    Fail(peer.status(),
         code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ? 2 : 1);
  }
  return (*peer)->Run();
}

}  // namespace

int PeerMain(int argc, char** argv, const PeerMainOptions& main_options) {
  rpc::BlockShutdownSignals();
  rpc::TuneAllocatorForModelStreams();
  SetLogProgramName(main_options.program);
  ParseCommandLineOrExit(
      argc, argv,
      {.program = main_options.program,
       .usage = "--coordinator HOST:PORT[,HOST:PORT...] --data-dir DIR (--tls-dir DIR | "
                "--insecure) [--shard I/N] "
                "[--model-dir DIR] [--scratch-dir DIR] [--evaluate-beside-training=false] "
                "[--download-against-held] "
                "[--listen HOST:PORT] [--advertise "
                "HOST:PORT | --relay HOST:PORT|auto|off] [--metrics-listen "
                "HOST:PORT] "
                "[--name ID] [--device cpu|cuda] [--torch-threads N] [--join-token TOKEN] "
                "[--upload-probe-bytes N] [--serve-pacing auto|off|MBIT] "
                "[--supernode [--supernode-binary PATH] "
                "[--supernode-listen HOST:PORT] [--supernode-advertise HOST:PORT]] "
                "[--address-file PATH]" +
                main_options.usage_extra +
                "\n"
                "--dpwa-config FILE --dpwa-node NAME --task-file FILE --data-dir DIR "
                "(--tls-dir DIR | --insecure) [--shard I/N] [--listen HOST:PORT] "
                "[--serve-pacing off|MBIT] "
                "[--final-model-out FILE] [--report-out FILE] [--exit-when-done]" +
                main_options.usage_extra +
                "\n"
                "--dht-listen HOST:PORT [--dht-bootstrap HOST:PORT] [--dht-min-members N] "
                "--task-file FILE --data-dir "
                "DIR --tls-dir DIR [--shard I/N] [--listen HOST:PORT] [--final-model-out FILE] "
                "[--report-out FILE] [--exit-when-done]" +
                main_options.usage_extra,
       .summary = "A Shoal peer: joins the coordinator's tasks and trains on its own data (or "
                  "its shard of shared data) with LibTorch, or gossips without a coordinator "
                  "from a dpwa config or with members found through a DHT."});

  PeerHooks hooks;
  if (main_options.hooks) {
    absl::StatusOr<PeerHooks> made = main_options.hooks();
    if (!made.ok()) Fail(made.status(), 2);
    hooks = *std::move(made);
  }

  rpc::GrpcLifetime grpc;  // outlives every gRPC object below (see its header)
  if (!absl::GetFlag(FLAGS_dpwa_config).empty() || !absl::GetFlag(FLAGS_dht_listen).empty()) {
    return grpc.Exit(RunStaticGossip(hooks));
  }

  PeerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  options.scratch_dir = absl::GetFlag(FLAGS_scratch_dir);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.evaluate_beside_training = absl::GetFlag(FLAGS_evaluate_beside_training);
  options.download_against_held = absl::GetFlag(FLAGS_download_against_held);
  options.name = absl::GetFlag(FLAGS_name);
  options.device = absl::GetFlag(FLAGS_device);
  options.address_file = absl::GetFlag(FLAGS_address_file);
  options.torch_threads = absl::GetFlag(FLAGS_torch_threads);
  options.tls.dir = absl::GetFlag(FLAGS_tls_dir);
  options.tls.insecure = absl::GetFlag(FLAGS_insecure);
  options.join_token = absl::GetFlag(FLAGS_join_token);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.relay = absl::GetFlag(FLAGS_relay);
  options.upload_probe_bytes = absl::GetFlag(FLAGS_upload_probe_bytes);
  options.serve_pacing = ServePacingFlag();
  options.hooks = std::move(hooks);
  options.supernode = absl::GetFlag(FLAGS_supernode);
  options.supernode_host.binary = absl::GetFlag(FLAGS_supernode_binary);
  if (options.supernode_host.binary.empty()) {
    options.supernode_host.binary = DefaultAggregatorBinary();
  }
  options.supernode_host.listen = absl::GetFlag(FLAGS_supernode_listen);
  if (options.supernode_host.listen.empty()) {
    absl::StatusOr<HostPort> listen = ParseHostPort(options.listen, "--listen");
    if (!listen.ok()) Fail(listen.status(), 2);
    listen->port = 0;
    options.supernode_host.listen = listen->ToString();
  }
  options.supernode_host.advertise = absl::GetFlag(FLAGS_supernode_advertise);
  if (const char* token = std::getenv("SHOAL_JOIN_TOKEN");
      options.join_token.empty() && token != nullptr) {
    options.join_token = token;
  }
  if (const std::string shard = absl::GetFlag(FLAGS_shard); !shard.empty()) {
    absl::StatusOr<training::ShardSpec> parsed = training::ParseShardSpec(shard, "--shard");
    if (!parsed.ok()) Fail(parsed.status(), 2);
    options.shard = *parsed;
  }
  if (absl::Status s = options.Validate(); !s.ok()) Fail(s, 2);

  absl::StatusOr<std::unique_ptr<PeerServer>> server = PeerServer::Start(options);
  if (!server.ok()) {
    const absl::StatusCode code = server.status().code();
    Fail(server.status(),
         code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ? 2 : 1);
  }
  const int code = (*server)->Run();
  server->reset();
  return grpc.Exit(code);
}

}  // namespace shoal::peer
