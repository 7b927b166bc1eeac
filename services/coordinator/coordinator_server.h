#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/common/executor.h"
#include "libs/metrics/metrics_server.h"
#include "libs/rpc/server.h"
#include "libs/rpc/tls.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/coordinator/console/console_server.h"
#include "services/coordinator/control_service.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/grpc_dialer.h"
#include "services/coordinator/registry_service.h"
#include "services/coordinator/session_service.h"
#include "services/coordinator/task_store.h"

namespace shoal::coordinator {

struct CoordinatorServerOptions {
  std::string listen = "127.0.0.1:7000";
  std::string metrics_listen = "127.0.0.1:9100";
  std::string state_dir;
  // Where tasks, rounds and checkpoint records live: "sqlite" (in state_dir) or
  // "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" (OpenTaskStore).
  std::string store = "sqlite";
  // With etcd: the TTL of the hold on the store's prefix (--store-lease), and what to do when
  // the hold is lost (the store writes nothing more; shoal-coordinator shuts down).
  absl::Duration store_lease = absl::Seconds(10);
  std::function<void(const absl::Status&)> on_store_lost;
  // With etcd: speak mutual TLS to its members, presenting this coordinator's certificate
  // (tls.dir) and checking theirs against its CA (--store-tls).
  bool store_tls = false;
  // With etcd, while another coordinator holds the prefix: wait as its standby (--standby;
  // meanwhile the gRPC address answers UNAVAILABLE naming the active one, StandbyServer) and
  // take over when its hold goes; false: fail after waiting a TTL and a half.
  bool standby = true;
  // With etcd: the HOST:PORT the other coordinators and the clients' errors name this one by
  // (--advertise): a standby's "active coordinator is X", a shared task's "served by X", the
  // membership key of --share-tasks. Empty: the bound --listen address, with the machine's
  // host name for a wildcard host (0.0.0.0).
  std::string advertise;
  // With etcd: every coordinator on the prefix serves, each task owned by one of them
  // (--share-tasks, store/task_ownership.h); no standby then.
  bool share_tasks = false;
  // When notified, a Start that waits as a standby returns CANCELLED. Not owned; may be null.
  const absl::Notification* stop = nullptr;
  std::string address_file;  // optional: where to write the bound addresses
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // How long a task whose aggregator was lost waits for another one to register before it fails.
  absl::Duration aggregator_wait = absl::Minutes(10);
  // How often each peer is dialed back again (0: once per session).
  absl::Duration redial_interval = absl::Minutes(5);
  // Checkpoints kept per task, the newest (0: every one).
  uint32_t keep_checkpoints = 3;
  // Ended tasks are deleted this long after they ended (zero: kept until DeleteTask).
  absl::Duration keep_ended_tasks = absl::ZeroDuration();
  // Elected supernodes (--supernode-*: election timeout, rebuild interval, better factor,
  // retire after).
  SupernodeOptions supernodes;
  rpc::TlsOptions tls;
  // The web console (--console-listen, --console-tokens); off when console.listen is empty. It
  // serves TLS with the certificate of tls.dir, plaintext with tls.insecure.
  console::ConsoleOptions console;

  // Errors name the flag: INVALID_ARGUMENT "--state-dir: ...".
  absl::Status Validate() const;
};

// The shoal-coordinator process: owns the store, the executors, the core, the gRPC server, the
// metrics endpoint and the driver thread that runs the core's timers. With etcd, Start first
// serves as a standby (StandbyServer) on the gRPC address until it holds the store's prefix,
// then serves the coordinator's services on the same address. Not thread-safe: one owner starts
// it and shuts it down.
class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options);
  ~CoordinatorServer();

  const std::string& address() const { return server_->address(); }
  const std::string& metrics_address() const { return metrics_->address(); }
  // The web console, or null when it is off.
  const console::ConsoleServer* console() const { return console_.get(); }
  // Sessions and calls without a socket (rpc::Server::InProcessChannel): shoal-sim style
  // benchmarks that host the coordinator in their own process.
  std::shared_ptr<grpc::Channel> InProcessChannel() const { return server_->InProcessChannel(); }
  // The core itself, for benchmarks whose sessions call it with no transport at all
  // (tests/bench/session_link.h).
  CoordinatorCore& core() const { return *core_; }

  // Stops accepting calls, ends streams, stops the driver. Idempotent.
  void Shutdown();

 private:
  CoordinatorServer() = default;
  void DriverLoop();

  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<CoordinatorMetrics> coordinator_metrics_;
  std::unique_ptr<TaskStore> store_;
  std::unique_ptr<aggregator::GrpcAggregatorClient> aggregators_;
  std::unique_ptr<GrpcDialer> dialer_;  // used by core_
  // Blocking work, off the gRPC threads (CoordinatorExecutors); outlive the core.
  std::unique_ptr<ThreadPool> calls_;
  std::unique_ptr<ThreadPool> transfers_;
  std::unique_ptr<ThreadPool> store_writes_;
  std::unique_ptr<ThreadPool> reads_;  // ControlService.GetModel's checkpoint reads
  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<SessionServiceImpl> session_service_;
  std::unique_ptr<ControlServiceImpl> control_service_;
  std::unique_ptr<RegistryServiceImpl> registry_service_;
  std::unique_ptr<rpc::Server> server_;
  // The web console: a ControlService client on server_'s in-process channel.
  std::unique_ptr<v1::ControlService::StubInterface> console_stub_;
  // With shared tasks, its clients of the other coordinators, by the address they are named by
  // (created at first use, kept while the console lives).
  absl::Mutex owner_stubs_mu_;
  std::map<std::string, std::unique_ptr<v1::ControlService::Stub>> owner_stubs_
      ABSL_GUARDED_BY(owner_stubs_mu_);
  std::unique_ptr<console::ConsoleServer> console_;
  absl::Mutex driver_mu_;
  bool stopping_ ABSL_GUARDED_BY(driver_mu_) = false;
  std::thread driver_;
};

}  // namespace shoal::coordinator
