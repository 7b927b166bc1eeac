#include "tests/bench/sim_coordinators.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "services/coordinator/served_by.h"
#include "tests/bench/proc_stats.h"
#include "tests/testing/http_get.h"
#ifdef SHOAL_HAVE_ETCD
#include "tests/testing/etcd_member.h"
#endif

namespace shoal::bench {

namespace cv1 = coordinator::v1;

namespace {

// The task's status as `control`'s coordinator answers it (its error as it gave it).
absl::StatusOr<cv1::TaskStatus> StatusAt(cv1::ControlService::Stub& control,
                                         const std::string& name) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(10));
  cv1::GetTaskStatusRequest request;
  request.set_name(name);
  cv1::GetTaskStatusResponse response;
  absl::Status s = rpc::FromGrpcStatus(control.GetTaskStatus(&context, request, &response));
  if (!s.ok()) return s;
  return response.status();
}

}  // namespace

absl::StatusOr<SimService> StartSimService(const std::string& dir, const std::string& bin_dir,
                                           const std::string& name, const std::string& binary,
                                           std::vector<std::string> args) {
  const std::string address_file = absl::StrCat(dir, "/", name, ".addr");
  args.insert(args.end(), {"--insecure", "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                           "--address-file=" + address_file});
  process::ProcessOptions options;
  options.name = name;
  options.binary = absl::StrCat(bin_dir, "/", binary);
  options.args = std::move(args);
  options.log_path = absl::StrCat(dir, "/", name, ".log");
  auto started = process::Process::Start(options);
  if (!started.ok()) return started.status();
  SimService service;
  service.process = *std::move(started);
  auto addresses =
      process::WaitForAddressFile(address_file, service.process.get(), absl::Seconds(30));
  if (!addresses.ok()) return addresses.status();
  service.address = addresses->at("grpc");
  service.metrics = addresses->at("metrics");
  return service;
}

SimCoordinators::SimCoordinators(SimCoordinatorOptions options) : options_(std::move(options)) {}

SimCoordinators::~SimCoordinators() { Stop(); }

absl::StatusOr<std::unique_ptr<SimCoordinators>> SimCoordinators::Start(
    SimCoordinatorOptions options) {
  if (options.count < 1) return absl::InvalidArgumentError("--coordinators must be at least 1");
  if (options.count > 1 && !options.etcd) {
    return absl::InvalidArgumentError(
        "several coordinators share their tasks on etcd: the store must be etcd");
  }
  std::unique_ptr<SimCoordinators> c(new SimCoordinators(std::move(options)));
  if (c->options_.etcd) {
    if (absl::Status s = c->StartEtcd(); !s.ok()) return s;
  }
  for (int i = 0; i < c->options_.count; ++i) {
    if (absl::Status s = c->StartOne(i); !s.ok()) return s;
    c->control_.push_back(cv1::ControlService::NewStub(rpc::MakeChannel(c->addresses_.back())));
  }
  return c;
}

absl::Status SimCoordinators::StartEtcd() {
#ifdef SHOAL_HAVE_ETCD
  const std::string dir = options_.dir + "/etcd";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  auto member = testing::EtcdMember::Start(dir);
  if (!member.ok()) return member.status();
  etcd_ = *std::move(member);
  store_ = absl::StrCat("etcd://", etcd_->endpoint(), "/shoal-sim");
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "this build has no etcd store (etcd's protos were not found when it was configured)");
#endif
}

absl::Status SimCoordinators::StartOne(int i) {
  const std::string name = options_.count == 1 ? "coordinator" : absl::StrCat("coordinator-", i);
  // One checkpoint directory for coordinators that share their tasks (a task moves with its
  // checkpoints), as in a deployment.
  const std::string state_dir = options_.dir + "/state";
  if (options_.transport == CoordinatorTransport::kTcp) {
    std::vector<std::string> args = {
        "--state-dir=" + state_dir,
        "--heartbeat-interval=" + absl::FormatDuration(options_.heartbeat_interval),
        "--store=" + store_};
    if (options_.etcd) {
      args.push_back("--store-lease=" + absl::FormatDuration(options_.store_lease));
      args.push_back("--share-tasks");
    }
    auto service =
        StartSimService(options_.dir, options_.bin_dir, name, "shoal-coordinator", std::move(args));
    if (!service.ok()) return service.status();
    addresses_.push_back(service->address);
    metrics_.push_back(service->metrics);
    processes_.push_back(*std::move(service));
    return absl::OkStatus();
  }
  coordinator::CoordinatorServerOptions server;
  server.listen = "127.0.0.1:0";
  server.metrics_listen = "127.0.0.1:0";
  server.state_dir = state_dir;
  server.heartbeat_interval = options_.heartbeat_interval;
  server.tls.insecure = true;
  server.store = store_;
  if (options_.etcd) {
    server.store_lease = options_.store_lease;
    server.share_tasks = true;
    server.on_store_lost = [this](const absl::Status&) { ++stores_lost_; };
  }
  auto started = coordinator::CoordinatorServer::Start(server);
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat(name, ": ", started.status().message()));
  }
  addresses_.push_back((*started)->address());
  metrics_.push_back((*started)->metrics_address());
  hosted_.push_back(*std::move(started));
  return absl::OkStatus();
}

std::string SimCoordinators::Addresses() const { return absl::StrJoin(addresses_, ","); }

absl::StatusOr<int> SimCoordinators::IndexOf(const std::string& address) const {
  for (int i = 0; i < size(); ++i) {
    if (addresses_[i] == address) return i;
  }
  return absl::NotFoundError(absl::StrCat("no coordinator of this run is at ", address));
}

absl::StatusOr<int> SimCoordinators::CreateTask(const common::v1::TaskSpec& spec) {
  {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(10));
    cv1::CreateTaskRequest request;
    *request.mutable_spec() = spec;
    cv1::CreateTaskResponse response;
    absl::Status s = rpc::FromGrpcStatus(control_[0]->CreateTask(&context, request, &response));
    if (!s.ok()) return s;
  }
  // The first coordinator serves the task, or names the one that does once it is placed.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::Status last;
  while (absl::Now() < deadline) {
    last = StatusAt(*control_[0], spec.name()).status();
    int index = -1;
    if (last.ok()) {
      index = 0;
    } else if (auto address = coordinator::ServingCoordinator(last)) {
      auto found = IndexOf(*address);
      if (!found.ok()) return found.status();
      index = *found;
    }
    if (index >= 0) {
      served_by_[spec.name()] = index;
      return index;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "task \"", spec.name(), "\": no coordinator served it within 30 s (", last.message(), ")"));
}

cv1::ControlService::Stub& SimCoordinators::ControlFor(const std::string& task) const {
  auto at = served_by_.find(task);
  return *control_[at == served_by_.end() ? 0 : at->second];
}

absl::StatusOr<cv1::TaskStatus> SimCoordinators::TaskStatus(const std::string& name) {
  return StatusAt(ControlFor(name), name);
}

void SimCoordinators::StopTask(const std::string& name) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(10));
  cv1::StopTaskRequest request;
  request.set_name(name);
  cv1::StopTaskResponse response;
  ControlFor(name).StopTask(&context, request, &response);
}

void SimCoordinators::Connect(int i, Fleet::Options& options) const {
  options.coordinator = addresses_[i];
  if (options_.transport == CoordinatorTransport::kDirect) {
    options.core = &hosted_[i]->core();
  } else if (options_.transport == CoordinatorTransport::kInProcess) {
    options.channel = hosted_[i]->InProcessChannel();
  }
}

double SimCoordinators::Metric(const std::string& metric) const {
  double sum = 0;
  for (const std::string& address : metrics_) {
    auto page = testing::HttpGet(address, "/metrics");
    if (!page.ok()) return -1;
    sum += testing::MetricValue(*page, metric);
  }
  return sum;
}

double SimCoordinators::CpuSeconds() const {
  if (hosted()) return bench::CpuSeconds(getpid());
  double cpu = 0;
  for (const SimService& p : processes_) cpu += bench::CpuSeconds(p.process->pid());
  return cpu;
}

double SimCoordinators::RssMiB() const {
  if (hosted()) return bench::RssMiB(getpid());
  double rss = 0;
  for (const SimService& p : processes_) rss += bench::RssMiB(p.process->pid());
  return rss;
}

double SimCoordinators::EtcdCpuSeconds() const {
#ifdef SHOAL_HAVE_ETCD
  if (etcd_ != nullptr) return bench::CpuSeconds(etcd_->pid());
#endif
  return 0;
}

absl::Status SimCoordinators::CheckRunning() const {
  if (stores_lost_.load() > 0) {
    return absl::UnavailableError(
        absl::StrCat(stores_lost_.load(), " coordinator(s) lost their hold on the etcd store"));
  }
  for (const SimService& p : processes_) {
    if (!p.process->Running()) {
      return absl::UnavailableError(
          absl::StrCat(p.process->name(), " exited: ", p.process->LogTail(10)));
    }
  }
  return absl::OkStatus();
}

void SimCoordinators::Stop() {
  if (stopped_) return;
  stopped_ = true;
  std::vector<process::Process*> coordinators;
  for (SimService& p : processes_) coordinators.push_back(p.process.get());
  process::StopInOrder({coordinators}, absl::Seconds(10));
  for (auto& server : hosted_) server->Shutdown();
  etcd_.reset();
}

}  // namespace shoal::bench
