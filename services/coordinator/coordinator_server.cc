#include "services/coordinator/coordinator_server.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/address.h"
#include "libs/common/address_file.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "services/coordinator/grpc_dialer.h"
#include "services/coordinator/standby_server.h"
#include "services/coordinator/store/checkpoint_sweep.h"

namespace shoal::coordinator {
namespace {

// HOST:PORT others reach `bound` at: a wildcard host (0.0.0.0, [::]) is this machine's name.
std::string AdvertisedAddress(const std::string& bound) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(bound, "--listen");
  if (!parsed.ok() || (parsed->host != "0.0.0.0" && parsed->host != "::" &&
                       parsed->host != "[::]" && !parsed->host.empty())) {
    return bound;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, ":", parsed->port);
}

}  // namespace

absl::Status CoordinatorServerOptions::Validate() const {
  SHOAL_RETURN_IF_ERROR(ParseHostPort(listen, "--listen").status());
  SHOAL_RETURN_IF_ERROR(ParseHostPort(metrics_listen, "--metrics-listen").status());
  if (state_dir.empty()) {
    return absl::InvalidArgumentError("--state-dir: required (where tasks and checkpoints live)");
  }
  if (store_lease < absl::Seconds(2) || store_lease > absl::Minutes(5)) {
    return absl::InvalidArgumentError("--store-lease: must be between 2s and 5m");
  }
  SHOAL_RETURN_IF_ERROR(tls.Validate());
  if (store_tls && !IsEtcdStore(store)) {
    return absl::InvalidArgumentError("--store-tls: only with --store etcd://...");
  }
  if (!advertise.empty()) {
    if (!IsEtcdStore(store)) {
      return absl::InvalidArgumentError("--advertise: only with --store etcd://...");
    }
    SHOAL_RETURN_IF_ERROR(ParseHostPort(advertise, "--advertise").status());
  }
  if (share_tasks && !IsEtcdStore(store)) {
    return absl::InvalidArgumentError("--share-tasks: only with --store etcd://...");
  }
  if (store_tls && tls.insecure) {
    return absl::InvalidArgumentError(
        "--store-tls: needs --tls-dir (its certificate and CA are what etcd gets and checks), "
        "not --insecure");
  }
  SHOAL_RETURN_IF_ERROR(console.Validate());
  if (heartbeat_interval < absl::Milliseconds(100) || heartbeat_interval > absl::Minutes(5)) {
    return absl::InvalidArgumentError("--heartbeat-interval: must be between 100ms and 5m");
  }
  if (keep_ended_tasks != absl::ZeroDuration() && keep_ended_tasks < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--keep-ended-tasks: must be 0 (keep them) or at least 1s");
  }
  if (aggregator_wait < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--aggregator-wait: must be at least 1s");
  }
  if (redial_interval != absl::ZeroDuration() && redial_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--redial-interval: must be 0 (off) or at least 1s");
  }
  if (supernodes.election_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--supernode-election-timeout: must be at least 1s");
  }
  if (supernodes.rebuild_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--supernode-rebuild-interval: must not be negative");
  }
  if (!(supernodes.better_factor >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--supernode-better-factor: must be at least 1, got ", supernodes.better_factor));
  }
  if (supernodes.retire_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--supernode-retire-after: must not be negative");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_ASSIGN_OR_RETURN(rpc::Credentials credentials, rpc::Credentials::Create(options.tls));
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  SHOAL_ASSIGN_OR_RETURN(s->metrics_,
                         metrics::MetricsServer::Start(options.metrics_listen, "--metrics-listen"));
  StoreOptions store;
  store.store = options.store;
  store.state_dir = options.state_dir;
  store.lease_ttl = options.store_lease;
  store.on_lost = options.on_store_lost;
  if (options.store_tls) store.etcd_credentials = credentials.channel();
  std::string listen = options.listen;
  std::unique_ptr<StandbyServer> standby;
  if (IsEtcdStore(options.store)) {
    // Until this coordinator holds the prefix, its address refuses calls naming the one that
    // does; the address is bound now, so that the owner key can name it.
    SHOAL_ASSIGN_OR_RETURN(standby, StandbyServer::Start(listen, credentials.server()));
    listen = standby->address();
    if (!options.address_file.empty()) {
      SHOAL_RETURN_IF_ERROR(WriteAddressFile(
          options.address_file, {{"grpc", listen}, {"metrics", s->metrics_address()}}));
    }
    store.advertise = options.advertise.empty() ? AdvertisedAddress(listen) : options.advertise;
    store.standby = options.standby && !options.share_tasks;
    store.share_tasks = options.share_tasks;
    store.stop = options.stop;
    store.on_held = [standby = standby.get()](const std::string& holder) {
      standby->SetActive(holder);
    };
  }
  SHOAL_ASSIGN_OR_RETURN(s->store_, OpenTaskStore(store));
  if (standby != nullptr) {
    if (standby->was_standby()) {
      // With shared tasks the key waited for was its own membership (a previous process on
      // the same address, whose lease had to lapse first), not another coordinator's hold.
      LogInfo(options.share_tasks ? "shared tasks: member of " : "standby: took over ",
              options.store, options.share_tasks ? " again, after its earlier lease lapsed" : "");
    }
    standby.reset();  // closes its listener: the address is the services' below
  }
  s->coordinator_metrics_ = std::make_unique<CoordinatorMetrics>(s->metrics_->registry());
  s->aggregators_ = std::make_unique<aggregator::GrpcAggregatorClient>(credentials.channel());
  // Bounded queues that in practice never fill (every task has at most a few calls queued); a
  // full one makes the caller run the work itself rather than lose it (SerialQueue).
  s->calls_ = std::make_unique<ThreadPool>(4, 4096);
  s->transfers_ = std::make_unique<ThreadPool>(2, 4096);
  s->store_writes_ = std::make_unique<ThreadPool>(1, 1 << 16);
  s->reads_ = std::make_unique<ThreadPool>(2, 64);
  // What the checkpoint directory holds that nothing needs, beside serving (with many tasks in
  // etcd the listing takes a while, and a take-over must not wait for it): the files in use are
  // younger than kSweepMinAge or recorded already.
  s->reads_->TrySubmit([store = s->store_.get()] {
    absl::StatusOr<SweptFiles> swept = SweepCheckpointDir(*store, kSweepMinAge, absl::Now());
    if (!swept.ok()) {
      LogWarning("checkpoint files not swept: ", swept.status().message());
    } else if (const size_t n = swept->names.size(); n > 0) {
      constexpr size_t kNamed = 10;
      swept->names.resize(std::min(n, kNamed));
      LogInfo("deleted ", n, " files of ", store->checkpoint_dir(),
              " that no checkpoint names, unchanged for ", absl::FormatDuration(kSweepMinAge),
              " or more (", swept->bytes / (1 << 20), " MiB): ", absl::StrJoin(swept->names, ", "),
              n > kNamed ? absl::StrCat(" and ", n - kNamed, " more") : "");
    }
  });
  CoordinatorOptions core_options;
  core_options.heartbeat_interval = options.heartbeat_interval;
  core_options.aggregator_wait = options.aggregator_wait;
  core_options.redial_interval = options.redial_interval;
  core_options.work.keep_checkpoints = options.keep_checkpoints;
  core_options.keep_ended_tasks = options.keep_ended_tasks;
  core_options.supernodes = options.supernodes;
  s->dialer_ = std::make_unique<GrpcDialer>(credentials.channel());
  core_options.dialer = s->dialer_.get();
  SHOAL_ASSIGN_OR_RETURN(
      s->core_,
      CoordinatorCore::Create(core_options, *s->store_, *s->aggregators_,
                              CoordinatorExecutors{*s->calls_, *s->transfers_, *s->store_writes_},
                              RealClock::Get(), *s->coordinator_metrics_));
  s->session_service_ = std::make_unique<SessionServiceImpl>(*s->core_);
  s->control_service_ = std::make_unique<ControlServiceImpl>(*s->core_, *s->store_, *s->reads_,
                                                             *s->coordinator_metrics_);
  s->registry_service_ = std::make_unique<RegistryServiceImpl>(*s->core_);
  if (TaskPlacement* placement = s->store_->placement(); placement != nullptr) {
    CoordinatorCore* core = s->core_.get();
    placement->Start(
        [core](const std::string& task) {
          if (absl::Status adopted = core->AdoptTask(task); !adopted.ok()) {
            LogError("task ", task, ": cannot take it over: ", adopted.ToString());
          }
        },
        [core](const std::string& task) {
          if (absl::Status handed = core->HandOffTask(task); !handed.ok()) {
            LogWarning("task ", task, ": not handed over: ", handed.message());
          }
        });
  }
  rpc::ServerOptions server_options;
  server_options.listen = listen;
  server_options.service_name = "shoal-coordinator";
  server_options.credentials = credentials.server();
  SHOAL_ASSIGN_OR_RETURN(
      s->server_,
      rpc::Server::Start(server_options, {s->session_service_.get(), s->control_service_.get(),
                                          s->registry_service_.get()}));
  s->driver_ = std::thread([server = s.get()] { server->DriverLoop(); });
  std::map<std::string, std::string> addresses = {{"grpc", s->address()},
                                                  {"metrics", s->metrics_address()}};
  if (!options.console.listen.empty()) {
    // The console calls the same ControlService as shoalctl does, without a socket.
    s->console_stub_ = v1::ControlService::NewStub(s->InProcessChannel());
    console::ConsoleOptions console = options.console;
    console.tls_dir = options.tls.insecure ? "" : options.tls.dir;
    console::ConsoleApi::OwnerStubs owners;
    if (s->store_->placement() != nullptr) {
      // A task another coordinator serves: its pages come from that one's ControlService.
      owners = [server = s.get(), channel = credentials.channel()](
                   const std::string& address) -> v1::ControlService::StubInterface* {
        absl::MutexLock lock(&server->owner_stubs_mu_);
        std::unique_ptr<v1::ControlService::Stub>& stub = server->owner_stubs_[address];
        if (stub == nullptr) stub = v1::ControlService::NewStub(rpc::MakeChannel(address, channel));
        return stub.get();
      };
    }
    SHOAL_ASSIGN_OR_RETURN(
        s->console_, console::ConsoleServer::Start(console, *s->console_stub_, std::move(owners)));
    addresses["console"] = s->console_->address();
  }
  if (!options.address_file.empty()) {
    SHOAL_RETURN_IF_ERROR(WriteAddressFile(options.address_file, addresses));
  }
  LogInfo("listening on ", s->address(), ", metrics on http://", s->metrics_address(),
          "/metrics, state in ", options.store == "sqlite" ? options.state_dir : options.store);
  if (!credentials.secure()) {
    LogWarning(
        "--insecure: serving PLAINTEXT gRPC without authentication; use only on a trusted "
        "network");
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::DriverLoop() {
  absl::MutexLock lock(&driver_mu_);
  while (!stopping_) {
    driver_mu_.Unlock();
    core_->Step();
    driver_mu_.Lock();
    // Timers need no finer grain; inputs never wait for the driver.
    driver_mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
  }
}

void CoordinatorServer::Shutdown() {
  {
    absl::MutexLock lock(&driver_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (console_) console_->Shutdown();  // ends its streams before the server's
  // The peers' sessions never end by themselves: end them first, so that the server waits
  // only for the calls in flight (at most 2 s).
  // No task is taken over any more (shared tasks).
  if (store_ != nullptr && store_->placement() != nullptr) store_->placement()->Stop();
  if (core_) core_->CloseSessions(absl::UnavailableError("the coordinator is shutting down"));
  if (server_) server_->Shutdown(absl::Seconds(2));
  if (driver_.joinable()) driver_.join();
  if (core_) {
    // The server takes no more calls: store what the last inputs left unsaved (EvalReports are
    // stored in batches) and wait for the store writes.
    core_->SaveUnsaved();
    core_.reset();  // cancels the watches, waits for the aggregator calls in flight
  }
  for (ThreadPool* pool : {reads_.get(), calls_.get(), transfers_.get(), store_writes_.get()}) {
    if (pool != nullptr) pool->Shutdown();
  }
}

}  // namespace shoal::coordinator
