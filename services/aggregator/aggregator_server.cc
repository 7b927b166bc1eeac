#include "services/aggregator/aggregator_server.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"
#include "libs/capacity/upload_probe.h"
#include "libs/common/address.h"
#include "libs/common/address_file.h"
#include "libs/common/backoff.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "libs/rpc/address_list.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "services/aggregator/grpc_parent_link.h"
#include "shoal/coordinator/v1/registry.grpc.pb.h"

namespace shoal::aggregator {
namespace {

// Threads of the pool for calls that wait on a tree node's parent.
constexpr size_t kParentTransferThreads = 4;

}  // namespace

absl::Status AggregatorOptions::Validate() const {
  if (auto s = ParseHostPort(listen, "--listen"); !s.ok()) return s.status();
  if (auto s = ParseHostPort(metrics_listen, "--metrics-listen"); !s.ok()) return s.status();
  if (coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator: required (HOST:PORT[,HOST:PORT...] of the coordinator)");
  }
  if (auto s = rpc::AddressList::Parse(coordinator, "--coordinator"); !s.ok()) return s.status();
  if (!advertise.empty()) {
    auto hp = ParseHostPort(advertise, "--advertise");
    if (!hp.ok()) return hp.status();
    if (hp->port == 0) return absl::InvalidArgumentError("--advertise: port must not be 0");
  }
  if (max_concurrent_pushes < 1 || max_concurrent_pushes > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-concurrent-pushes: must be in [1, 1024], got ", max_concurrent_pushes));
  }
  if (upload_probe_bytes > capacity::kMaxUploadProbeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--upload-probe-bytes: at most ",
                                                   capacity::kMaxUploadProbeBytes, ", got ",
                                                   upload_probe_bytes));
  }
  if (max_buffer_bytes < 1) {
    return absl::InvalidArgumentError("--max-buffer-bytes: must be >= 1");
  }
  if (executor_threads < 1) {
    return absl::InvalidArgumentError("executor_threads must be >= 1");
  }
  return tls.Validate();
}

absl::StatusOr<std::unique_ptr<AggregatorServer>> AggregatorServer::Start(
    const AggregatorOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<AggregatorServer> self(new AggregatorServer());
  self->options_ = options;

  auto metrics = metrics::MetricsServer::Start(options.metrics_listen, "--metrics-listen");
  if (!metrics.ok()) return metrics.status();
  self->metrics_ = *std::move(metrics);
  self->aggregator_metrics_ = std::make_unique<AggregatorMetrics>(self->metrics_->registry());

  AggregatorCoreOptions core_options;
  core_options.max_concurrent_pushes = options.max_concurrent_pushes;
  core_options.max_buffer_bytes = options.max_buffer_bytes;
  auto core = AggregatorCore::Create(core_options, RealClock::Get(), *self->aggregator_metrics_);
  if (!core.ok()) return core.status();
  self->core_ = *std::move(core);
  // Queue room for every staged push plus control calls; beyond that answer RESOURCE_EXHAUSTED.
  self->executor_ = std::make_unique<ThreadPool>(
      options.executor_threads, static_cast<size_t>(options.max_concurrent_pushes) * 2 + 16);
  // Calls that wait on a tree node's parent (a version fetched down, a child round's partial sum
  // sent up): a few at once, apart from the folds. The coordinator sends a task's round calls one
  // at a time, so a few threads cover the tasks a node serves at once.
  self->transfers_ = std::make_unique<ThreadPool>(kParentTransferThreads, 64);
  auto credentials = rpc::Credentials::Create(options.tls);
  if (!credentials.ok()) return credentials.status();
  self->channel_credentials_ = credentials->channel();
  if (!credentials->secure()) {
    LogWarning("--insecure: PLAINTEXT gRPC without authentication; use only on a trusted network");
  }
  // The parent aggregator of a tree node: its models come over this client, its partial sums go
  // up over the link (a child round's at CloseRound, a federated-async node's full buffers).
  self->parents_ = std::make_unique<GrpcAggregatorClient>(self->channel_credentials_);
  self->parent_link_ =
      std::make_unique<GrpcParentLink>(*self->parents_, *self->aggregator_metrics_);
  self->core_->SetParentLink(self->parent_link_.get());
  // One encoding per published version, one at a time; a few queued (at most one per task
  // downloaded against held versions, and abandoned ones that return at once).
  self->encoder_ = std::make_unique<ThreadPool>(1, 8);
  AggregatorMetrics* aggregator_metrics = self->aggregator_metrics_.get();
  self->downloads_ = std::make_unique<DownloadDeltas>(
      *self->encoder_, /*max_tasks=*/2,
      [aggregator_metrics](double seconds) {
        aggregator_metrics->download_encodes.Increment();
        aggregator_metrics->download_encode_seconds.Increment(seconds);
      },
      /*encode_threads=*/
      std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 8));
  DownloadDeltas* downloads = self->downloads_.get();
  self->core_->SetOnPublished([downloads](const std::string& task, const ModelSnapshot& published,
                                          const ModelSnapshot& previous) {
    downloads->Prepare(task, published, previous);
  });
  self->service_ = std::make_unique<AggregatorServiceImpl>(
      AggregatorServiceOptions{core_options.limits}, *self->core_, *self->executor_,
      *self->transfers_, *self->aggregator_metrics_, *self->parents_, *self->parent_link_,
      *self->downloads_);
  self->relay_hub_ = std::make_unique<RelayHub>(RelayHub::Options{}, *self->aggregator_metrics_);
  self->relay_service_ = std::make_unique<RelayServiceImpl>(*self->relay_hub_);
  self->relay_peer_service_ = std::make_unique<RelayPeerServiceImpl>(*self->relay_hub_);
  rpc::ServerOptions server_options;
  server_options.listen = options.listen;
  server_options.service_name = "shoal-aggregator";
  server_options.credentials = credentials->server();
  auto server = rpc::Server::Start(
      server_options,
      {self->service_.get(), self->relay_service_.get(), self->relay_peer_service_.get()});
  if (!server.ok()) return server.status();
  self->server_ = *std::move(server);

  self->advertise_ = options.advertise;
  if (self->advertise_.empty()) {
    auto hp = ParseHostPort(self->server_->address(), "bound address");
    if (hp.ok() && (hp->host == "0.0.0.0" || hp->host == "::" || hp->host.empty())) {
      hp->host = "127.0.0.1";
      LogWarning("listening on all interfaces; advertising ", hp->ToString(),
                 " (set --advertise for other hosts)");
      self->advertise_ = hp->ToString();
    } else {
      self->advertise_ = self->server_->address();
    }
  }
  if (!options.address_file.empty()) {
    absl::Status s = WriteAddressFile(
        options.address_file,
        {{"grpc", self->server_->address()}, {"metrics", self->metrics_->address()}});
    if (!s.ok()) return s;
  }
  self->capacity_ = capacity::MeasureLocalCapacity();
  self->upload_measured_ = options.upload_probe_bytes == 0;
  LogInfo("capacity: ", capacity::Describe(self->capacity_));
  LogInfo("serving on ", self->server_->address(), " (metrics on ", self->metrics_->address(),
          "), advertising ", self->advertise_, ", coordinator ", options.coordinator);
  // Registered with every coordinator of the list that serves: the active one of an active
  // coordinator and its standbys, or each one of coordinators that share their tasks.
  // Validated by AggregatorOptions::Validate.
  std::vector<std::string> coordinators =
      *rpc::AddressList::Parse(options.coordinator, "--coordinator");
  AggregatorServer* raw = self.get();
  for (const std::string& address : coordinators) {
    std::shared_ptr<grpc::Channel> channel =
        self->channel_credentials_ != nullptr
            ? rpc::MakeChannel(address, self->channel_credentials_)
            : rpc::MakeChannel(address);
    self->registrations_.emplace_back(
        [raw, address, channel] { raw->RegistrationLoop(address, channel); });
  }
  return self;
}

AggregatorServer::~AggregatorServer() { Shutdown(); }

bool AggregatorServer::registered() const {
  absl::MutexLock lock(&mu_);
  return !registered_at_.empty();
}

bool AggregatorServer::MeasureUpload(const std::string& address,
                                     const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = coordinator::v1::SessionService::NewStub(channel);
  grpc::ClientContext context;
  rpc::SetTimeout(context, options_.upload_probe_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return true;
    in_flight_.insert(&context);
  }
  absl::StatusOr<double> rate =
      capacity::MeasureUpload(*stub, context, options_.upload_probe_bytes);
  absl::MutexLock lock(&mu_);
  in_flight_.erase(&context);
  if (stopping_) return true;
  const capacity::UploadProbeOutcome outcome =
      capacity::LogUploadProbe(rate, address, options_.upload_probe_bytes);
  if (outcome == capacity::UploadProbeOutcome::kMeasured) {
    capacity_.set_upload_bytes_per_second(*rate);
    capacity_.set_upload_probe_bytes(options_.upload_probe_bytes);
  }
  return outcome != capacity::UploadProbeOutcome::kRetry;
}

void AggregatorServer::RegistrationLoop(std::string address,
                                        std::shared_ptr<grpc::Channel> channel) {
  // Capped at 1 s, so that the aggregator is back soon after a coordinator (re)starts or takes
  // over as the active one.
  Backoff backoff(BackoffOptions{absl::Milliseconds(200), absl::Seconds(1), 2.0, 0.2});
  bool was_ok = false;
  bool warned = false;
  for (;;) {
    bool measure = false;
    {
      absl::MutexLock lock(&mu_);
      // One loop times the upload (to its coordinator) before registering anywhere.
      if (!upload_measured_ && !measuring_) measure = measuring_ = true;
    }
    if (measure) {
      const bool done = MeasureUpload(address, channel);
      absl::MutexLock lock(&mu_);
      upload_measured_ = done;
      measuring_ = false;
    }
    grpc::ClientContext context;
    rpc::SetTimeout(context, options_.register_timeout);
    coordinator::v1::RegisterAggregatorRequest request;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      in_flight_.insert(&context);
      *request.mutable_capacity() = capacity_;
    }
    request.set_address(advertise_);
    request.set_host_peer(options_.host_peer);
    const TaskCalls::Held held = core_->Held();
    for (const std::string& task : held.names) request.add_tasks(task);
    coordinator::v1::RegisterAggregatorResponse response;
    grpc::Status status = coordinator::v1::RegistryService::NewStub(channel)->RegisterAggregator(
        &context, request, &response);
    {
      absl::MutexLock lock(&mu_);
      in_flight_.erase(&context);
      if (stopping_) return;
    }
    absl::Duration wait;
    if (status.ok()) {
      if (!was_ok) LogInfo("registered with coordinator ", address);
      was_ok = true;
      warned = false;
      backoff.Reset();
      ReleaseUnused(address, response, held.as_of);
      wait = response.heartbeat_interval_ms() > 0
                 ? absl::Milliseconds(response.heartbeat_interval_ms())
                 : options_.default_heartbeat_interval;
      // Register a little before the interval ends.
      wait = wait * 0.8;
    } else {
      if (was_ok || !warned) {
        LogWarning("cannot register with coordinator ", address, ": ",
                   rpc::FromGrpcStatus(status).ToString(), " (retrying)");
        warned = true;
      }
      was_ok = false;
      wait = backoff.Next();
    }
    absl::MutexLock lock(&mu_);
    if (was_ok) {
      registered_at_.insert(address);
    } else {
      registered_at_.erase(address);
    }
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait)) return;
  }
}

void AggregatorServer::ReleaseUnused(const std::string& coordinator,
                                     const coordinator::v1::RegisterAggregatorResponse& response,
                                     uint64_t as_of) {
  for (const std::string& task : response.release()) {
    if (!core_->ReleaseUnlessCalledSince(task, as_of)) continue;
    downloads_->Release(task);
    LogInfo("task ", EscapeBytes(task), " freed: coordinator ", coordinator,
            " no longer uses this aggregator for it");
  }
}

void AggregatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }
  for (std::thread& registration : registrations_) registration.join();
  registrations_.clear();
  if (server_ != nullptr) server_->Shutdown(options_.shutdown_grace);
  if (executor_ != nullptr) executor_->Shutdown();
  if (transfers_ != nullptr) transfers_->Shutdown();
  // Nothing publishes any more: an encoding under way stops at its next block.
  if (core_ != nullptr) core_->SetOnPublished(nullptr);
  if (downloads_ != nullptr) downloads_->Stop();
  if (encoder_ != nullptr) encoder_->Shutdown();
  // No fold runs any more: what is left for a parent is sent (or given up on) while the link
  // is still there.
  if (core_ != nullptr) core_->AwaitTransfers();
}

}  // namespace shoal::aggregator
