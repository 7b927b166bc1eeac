#include "services/coordinator/coordinator_server.h"

#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/address_file.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"

namespace shoal::coordinator {

absl::Status CoordinatorServerOptions::Validate() const {
  SHOAL_RETURN_IF_ERROR(ParseHostPort(listen, "--listen").status());
  SHOAL_RETURN_IF_ERROR(ParseHostPort(metrics_listen, "--metrics-listen").status());
  if (state_dir.empty()) {
    return absl::InvalidArgumentError("--state-dir: required (where tasks and checkpoints live)");
  }
  SHOAL_RETURN_IF_ERROR(tls.Validate());
  if (heartbeat_interval < absl::Milliseconds(100) || heartbeat_interval > absl::Minutes(5)) {
    return absl::InvalidArgumentError("--heartbeat-interval: must be between 100ms and 5m");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_ASSIGN_OR_RETURN(rpc::Credentials credentials, rpc::Credentials::Create(options.tls));
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  SHOAL_ASSIGN_OR_RETURN(s->store_, TaskStore::Open(options.state_dir));
  SHOAL_ASSIGN_OR_RETURN(s->metrics_,
                         metrics::MetricsServer::Start(options.metrics_listen, "--metrics-listen"));
  s->coordinator_metrics_ = std::make_unique<CoordinatorMetrics>(s->metrics_->registry());
  s->aggregators_ = std::make_unique<aggregator::GrpcAggregatorClient>(credentials.channel());
  CoordinatorOptions core_options;
  core_options.heartbeat_interval = options.heartbeat_interval;
  SHOAL_ASSIGN_OR_RETURN(s->core_,
                         CoordinatorCore::Create(core_options, *s->store_, *s->aggregators_,
                                                 RealClock::Get(), *s->coordinator_metrics_));
  s->session_service_ = std::make_unique<SessionServiceImpl>(*s->core_);
  s->control_service_ = std::make_unique<ControlServiceImpl>(*s->core_, *s->coordinator_metrics_);
  s->registry_service_ = std::make_unique<RegistryServiceImpl>(*s->core_);
  rpc::ServerOptions server_options;
  server_options.listen = options.listen;
  server_options.service_name = "shoal-coordinator";
  server_options.credentials = credentials.server();
  SHOAL_ASSIGN_OR_RETURN(
      s->server_,
      rpc::Server::Start(server_options, {s->session_service_.get(), s->control_service_.get(),
                                          s->registry_service_.get()}));
  s->driver_ = std::thread([server = s.get()] { server->DriverLoop(); });
  if (!options.address_file.empty()) {
    SHOAL_RETURN_IF_ERROR(WriteAddressFile(
        options.address_file, {{"grpc", s->address()}, {"metrics", s->metrics_address()}}));
  }
  LogInfo("listening on ", s->address(), ", metrics on http://", s->metrics_address(),
          "/metrics, state in ", options.state_dir);
  if (!credentials.secure()) {
    LogWarning(
        "--insecure: serving PLAINTEXT gRPC without authentication; use only on a trusted "
        "network");
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::DriverLoop() {
  while (!stopping_.load()) {
    core_->Step();
    core_->WaitForWork(absl::Milliseconds(100));
  }
  // The server takes no more calls: store what the last inputs left unsaved (EvalReports are
  // stored in batches), without starting new aggregator jobs.
  core_->SaveUnsaved();
}

void CoordinatorServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (server_) server_->Shutdown(absl::Seconds(2));
  if (driver_.joinable()) driver_.join();
}

}  // namespace shoal::coordinator
