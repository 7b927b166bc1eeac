// shoal-coordinator: task registry, membership, rounds and the ControlService API.

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/common/command_line.h"
#include "libs/common/log.h"
#include "libs/rpc/grpc_lifetime.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/signals.h"
#include "services/coordinator/coordinator_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7000", "HOST:PORT for gRPC (port 0 = any free port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9100",
          "HOST:PORT for Prometheus /metrics (port 0 = any free port)");
ABSL_FLAG(std::string, state_dir, "",
          "directory for the task database (with --store sqlite) and model checkpoints");
ABSL_FLAG(std::string, store, "sqlite",
          "where tasks, rounds and checkpoint records live: sqlite (a database in --state-dir) "
          "or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcd's members; keys under /PREFIX, "
          "by default /shoal; checkpoint files stay in --state-dir)");
ABSL_FLAG(absl::Duration, store_lease, absl::Seconds(10),
          "with --store etcd://: the TTL of this coordinator's hold on its key prefix: a standby "
          "takes over within about this long after the active coordinator died, and a "
          "coordinator that could not renew its hold for this long steps down (exit code 1)");
ABSL_FLAG(bool, store_tls, false,
          "with --store etcd://: mutual TLS to etcd's members, with this coordinator's "
          "--tls-dir certificate and CA (the members serve https client URLs and check client "
          "certificates against the same CA)");
ABSL_FLAG(bool, standby, true,
          "with --store etcd://: while another coordinator holds the key prefix, wait as its "
          "standby (the gRPC address answers UNAVAILABLE naming the active one) and take over "
          "when its hold lapses; --standby=false: exit (code 1) naming the holder after waiting "
          "1.5 times --store-lease");
ABSL_FLAG(bool, share_tasks, false,
          "with --store etcd://: every coordinator on the key prefix serves, each task owned by "
          "one of them under its lease (the least loaded live coordinator, counting its open "
          "tasks and their peers, when the task is created, or when its owner dies); calls "
          "about another coordinator's task are answered UNAVAILABLE naming it. No standby: "
          "--standby is ignored");
ABSL_FLAG(std::string, advertise, "",
          "with --store etcd://: HOST:PORT that other coordinators and clients' errors name "
          "this coordinator by (a standby's active coordinator, a shared task's owner; "
          "default: the bound --listen address, with the host name for 0.0.0.0)");
ABSL_FLAG(std::string, address_file, "",
          "if set, write the bound addresses here (grpc=HOST:PORT, metrics=HOST:PORT)");
ABSL_FLAG(std::string, tls_dir, "",
          "mutual TLS: a directory with ca.crt, tls.crt, tls.key (see scripts/gen-certs)");
ABSL_FLAG(bool, insecure, false, "serve and call plaintext gRPC instead of mutual TLS");
ABSL_FLAG(std::string, console_listen, "",
          "HOST:PORT for the web console (HTTPS with --tls-dir's tls.crt, HTTP with --insecure; "
          "port 0 = any free port); empty = no console");
ABSL_FLAG(std::string, console_tokens, "",
          "with --console-listen: a file of `admin TOKEN` / `viewer TOKEN` lines, the console's "
          "logins (docs/how-to/web-console.md)");
ABSL_FLAG(uint32_t, keep_checkpoints, 3,
          "checkpoints kept per task, the newest; older ones are deleted, record and file "
          "(0 keeps every one)");
ABSL_FLAG(absl::Duration, keep_ended_tasks, absl::ZeroDuration(),
          "how long an ended task (completed, failed or stopped) is kept after it ended; then "
          "it is deleted with its rounds, checkpoints and their files (0 keeps every one until "
          "`shoalctl task delete`)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2),
          "how often peers send heartbeats; 3 missed = crashed");
ABSL_FLAG(absl::Duration, aggregator_wait, absl::Minutes(10),
          "how long a task whose aggregator was lost waits for another one to register before "
          "it fails (tasks move to another registered aggregator at once)");
ABSL_FLAG(absl::Duration, redial_interval, absl::Minutes(5),
          "how often the coordinator dials each peer back again to check that it can be reached "
          "(one found unreachable is moved to a relay unless it runs with --relay=off); 0 = "
          "once per session");
ABSL_FLAG(absl::Duration, supernode_election_timeout, absl::Seconds(30),
          "a peer elected supernode whose aggregator has not registered by then is passed over");
ABSL_FLAG(absl::Duration, supernode_rebuild_interval, absl::Seconds(30),
          "hysteresis: a hierarchical task's tree is rebuilt on newly available supernodes (which "
          "reruns its current round) at most once per interval");
ABSL_FLAG(double, supernode_better_factor, 2.0,
          "a free node replaces a cluster's aggregator only with at least this many times its "
          "measured upload, or this many times its compute (cores x matrix-multiply score) "
          "behind an upload at least half its");
ABSL_FLAG(absl::Duration, supernode_retire_after, absl::Seconds(60),
          "an elected supernode that no task has used for this long is retired");

int main(int argc, char** argv) {
  shoal::rpc::BlockShutdownSignals();
  shoal::rpc::TuneAllocatorForModelStreams();
  shoal::SetLogProgramName("shoal-coordinator");
  shoal::ParseCommandLineOrExit(
      argc, argv,
      {.program = "shoal-coordinator",
       .usage = "--state-dir DIR (--tls-dir DIR | --insecure) [--listen HOST:PORT] "
                "[--metrics-listen HOST:PORT] [--heartbeat-interval D] [--aggregator-wait D] "
                "[--redial-interval D] [--address-file PATH] [--supernode-election-timeout D] "
                "[--supernode-rebuild-interval D] [--supernode-better-factor X] "
                "[--supernode-retire-after D] [--store sqlite|etcd://HOST:PORT[,...][/PREFIX]] "
                "[--store-lease D] [--store-tls] [--standby=false] [--share-tasks] "
                "[--advertise HOST:PORT] "
                "[--keep-checkpoints N] "
                "[--console-listen HOST:PORT --console-tokens FILE]",
       .summary = "The Shoal coordinator: task registry, membership, rounds, checkpoints, the "
                  "ControlService API and the web console."});

  shoal::coordinator::CoordinatorServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.store = absl::GetFlag(FLAGS_store);
  options.store_lease = absl::GetFlag(FLAGS_store_lease);
  options.standby = absl::GetFlag(FLAGS_standby);
  options.share_tasks = absl::GetFlag(FLAGS_share_tasks);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.store_tls = absl::GetFlag(FLAGS_store_tls);
  // A coordinator that lost its hold on the etcd store must not go on: it stops, exit code 1.
  static std::atomic<bool> store_lost{false};
  options.on_store_lost = [](const absl::Status& why) {
    shoal::LogError("store: ", why.message(), "; stepping down");
    store_lost = true;
    shoal::rpc::RequestShutdown();
  };
  options.address_file = absl::GetFlag(FLAGS_address_file);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.aggregator_wait = absl::GetFlag(FLAGS_aggregator_wait);
  options.redial_interval = absl::GetFlag(FLAGS_redial_interval);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.keep_ended_tasks = absl::GetFlag(FLAGS_keep_ended_tasks);
  options.supernodes.election_timeout = absl::GetFlag(FLAGS_supernode_election_timeout);
  options.supernodes.rebuild_interval = absl::GetFlag(FLAGS_supernode_rebuild_interval);
  options.supernodes.better_factor = absl::GetFlag(FLAGS_supernode_better_factor);
  options.supernodes.retire_after = absl::GetFlag(FLAGS_supernode_retire_after);
  options.tls.dir = absl::GetFlag(FLAGS_tls_dir);
  options.tls.insecure = absl::GetFlag(FLAGS_insecure);
  options.console.listen = absl::GetFlag(FLAGS_console_listen);
  options.console.tokens_file = absl::GetFlag(FLAGS_console_tokens);
  if (absl::Status s = options.Validate(); !s.ok()) {
    std::fprintf(stderr, "shoal-coordinator: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  shoal::rpc::GrpcLifetime grpc;  // outlives every gRPC object below (see its header)
  // Signals are awaited from the start: a standby waits in Start until it takes over.
  absl::Notification stop;
  int sig = 0;
  std::thread signals([&] {
    sig = shoal::rpc::WaitForShutdownSignal();
    stop.Notify();
  });
  options.stop = &stop;
  auto server = shoal::coordinator::CoordinatorServer::Start(options);
  if (!server.ok()) {
    const bool stopped = stop.HasBeenNotified();
    if (!stopped) shoal::rpc::RequestShutdown();
    signals.join();
    if (stopped && absl::IsCancelled(server.status())) {
      shoal::LogInfo("signal ", sig, ": stopped as a standby");
      return grpc.Exit(0);
    }
    std::fprintf(stderr, "shoal-coordinator: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  stop.WaitForNotification();
  signals.join();
  // sig 0: the process asked itself to stop (RequestShutdown), having said why.
  if (sig != 0) shoal::LogInfo("signal ", sig, ": shutting down");
  (*server)->Shutdown();
  server->reset();
  shoal::LogInfo("stopped");
  return grpc.Exit(store_lost ? 1 : 0);
}
