#include "tests/cluster/cluster.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/wait.h"

namespace shoal::testing {

namespace cv1 = coordinator::v1;

Cluster::Cluster(std::string dir) : dir_(std::move(dir)) {
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  bin_dir_ = bin != nullptr ? bin : "build/bin";
  absl::Status certs = MakeCertificate("client");
  if (certs.ok()) {
    rpc::TlsOptions tls;
    tls.dir = ClientTlsDir();
    absl::StatusOr<rpc::Credentials> credentials = rpc::Credentials::Create(tls);
    if (credentials.ok()) credentials_ = credentials->channel();
  }
}

absl::Status Cluster::MakeCertificate(const std::string& name) {
  process::ProcessOptions options;
  options.name = "gen-certs";
  options.binary = bin_dir_ + "/shoal-gen-certs";
  options.args = {dir_ + "/certs", name};
  options.log_path = dir_ + "/gen-certs.log";
  if (host_ != "127.0.0.1") options.env["SHOAL_CERT_EXTRA_SANS"] = "IP:" + host_;
  auto proc = process::Process::Start(std::move(options));
  if (!proc.ok()) return proc.status();
  auto exit = (*proc)->Wait(absl::Seconds(30));
  if (!exit.ok()) return exit.status();
  if (!exit->success()) return absl::InternalError("gen-certs: " + (*proc)->LogTail(5));
  return absl::OkStatus();
}

Cluster::~Cluster() {
  std::vector<process::Process*> peers;
  for (auto& [i, s] : peers_) {
    if (s.process) peers.push_back(s.process.get());
  }
  std::vector<std::vector<process::Process*>> groups = {peers};
  std::vector<process::Process*> aggregators;
  for (auto& s : aggregators_) {
    if (s.process) aggregators.push_back(s.process.get());
  }
  groups.push_back(aggregators);
  std::vector<process::Process*> coordinators;
  if (coordinator_.process) coordinators.push_back(coordinator_.process.get());
  for (Service& s : standbys_) {
    if (s.process) coordinators.push_back(s.process.get());
  }
  groups.push_back(coordinators);
  // A service still running now must stop cleanly on SIGTERM: exit code 0 within the grace
  // period (one the test stopped or killed itself is its own business).
  std::vector<process::Process*> running;
  for (const auto& group : groups) {
    for (process::Process* p : group) {
      if (p->Running()) running.push_back(p);
    }
  }
  const absl::Duration grace = testing::Scaled(absl::Seconds(10));
  std::map<process::Process*, std::string> stacks;
  process::StopInOrder(groups, grace, [&](process::Process& p) { stacks[&p] = DumpStacks(p); });
  for (process::Process* p : running) {
    const absl::StatusOr<process::ExitStatus> exit = p->Wait(absl::ZeroDuration());
    if (!exit.ok() || !exit->success()) {
      ADD_FAILURE() << p->name() << " did not stop cleanly on SIGTERM within " << grace << ": "
                    << (exit.ok() ? exit->ToString() : exit.status().ToString()) << "\n"
                    << p->LogTail(20) << stacks[p];
    }
  }
  ExpectNoSanitizerReports();
}

std::string Cluster::DumpStacks(process::Process& p) {
  // Where a service hangs in its shutdown is the whole diagnosis: gdb, when this machine has
  // it, prints every thread's stack before the SIGKILL.
  if (access("/usr/bin/gdb", X_OK) != 0) return "(no /usr/bin/gdb: no stacks)\n";
  process::ProcessOptions options;
  options.name = "gdb";
  options.binary = "/usr/bin/gdb";
  options.args = {"-p", absl::StrCat(p.pid()), "-batch", "-nx", "-ex", "thread apply all bt 30"};
  options.log_path = absl::StrCat(dir_, "/", p.name(), ".stacks.txt");
  absl::StatusOr<std::unique_ptr<process::Process>> gdb = process::Process::Start(options);
  if (!gdb.ok()) return absl::StrCat("(gdb: ", gdb.status().ToString(), ")\n");
  if (!(*gdb)->Wait(absl::Seconds(60)).ok()) {
    (*gdb)->Signal(SIGKILL);
    (void)(*gdb)->Wait(absl::Seconds(10));
  }
  return absl::StrCat("threads of ", p.name(), " before SIGKILL (", options.log_path, "):\n",
                      process::TailFile(options.log_path, 400));
}

void Cluster::ExpectNoSanitizerReports() {
  // The markers ASan, LSan, UBSan and TSan start their reports with; every service's log
  // (restarted services append to theirs) is read.
  constexpr absl::string_view kMarkers[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                            ": runtime error: ", "WARNING: ThreadSanitizer"};
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".log") continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      for (absl::string_view marker : kMarkers) {
        if (absl::StrContains(line, marker)) {
          ADD_FAILURE() << entry.path().string() << ":" << number
                        << ": a sanitizer report: " << line << "\n"
                        << process::TailFile(entry.path().string(), 40);
          break;
        }
      }
    }
  }
}

absl::StatusOr<Service> Cluster::Start(const std::string& name, const std::string& binary,
                                       std::vector<std::string> args, std::string listen,
                                       const std::string& netns, std::string identity) {
  auto launched =
      Launch(name, binary, std::move(args), std::move(listen), netns, std::move(identity));
  if (!launched.ok()) return launched.status();
  return WaitForAddresses(*std::move(launched));
}

absl::StatusOr<Cluster::Launched> Cluster::Launch(const std::string& name,
                                                  const std::string& binary,
                                                  std::vector<std::string> args, std::string listen,
                                                  const std::string& netns, std::string identity) {
  if (listen.empty()) listen = host_ + ":0";
  if (identity.empty()) identity = name;
  if (absl::Status certs = MakeCertificate(identity); !certs.ok()) return certs;
  args.push_back(absl::StrCat("--tls-dir=", dir_, "/certs/", identity));
  const std::string address_file = absl::StrCat(dir_, "/", name, ".addr");
  std::remove(address_file.c_str());
  args.push_back("--listen=" + listen);
  args.push_back("--metrics-listen=127.0.0.1:0");
  args.push_back("--address-file=" + address_file);
  process::ProcessOptions options;
  options.name = name;
  options.binary = absl::StrCat(bin_dir_, "/", binary);
  options.args = std::move(args);
  if (!netns.empty()) {  // ip netns exec NETNS BINARY ARGS...: it execs BINARY in the namespace
    options.args.insert(options.args.begin(), {"netns", "exec", netns, options.binary});
    options.binary = "/usr/sbin/ip";
  }
  options.log_path = absl::StrCat(dir_, "/", name, ".log");
  auto proc = process::Process::Start(std::move(options));
  if (!proc.ok()) return proc.status();
  return Launched{*std::move(proc), address_file};
}

absl::StatusOr<Service> Cluster::WaitForAddresses(Launched launched) {
  auto addresses = process::WaitForAddressFile(launched.address_file, launched.process.get(),
                                               testing::Scaled(absl::Seconds(60)));
  if (!addresses.ok()) return addresses.status();
  Service service;
  service.process = std::move(launched.process);
  service.address = (*addresses)["grpc"];
  service.metrics_address = (*addresses)["metrics"];
  return service;
}

absl::Status Cluster::StartCoordinator(std::vector<std::string> extra_args) {
  coordinator_args_ = std::move(extra_args);
  return StartCoordinatorOn(host_ + ":0");
}

absl::Status Cluster::RestartCoordinator(bool crash) {
  const std::string address = coordinator_.address;
  // Hold the port from before the old coordinator goes until the new one listens, so that a
  // test running beside this one is not handed it in between.
  const size_t colon = address.rfind(':');
  absl::StatusOr<ReservedPort> hold = ReservedPort::Reserve(std::stoi(address.substr(colon + 1)));
  if (!hold.ok()) return hold.status();
  if (crash) {
    coordinator_.process->Signal(SIGKILL);
    auto exit = coordinator_.process->Wait(absl::Seconds(10));
    if (!exit.ok()) return exit.status();
  } else {
    process::ExitStatus exit = coordinator_.process->Stop(absl::Seconds(10));
    if (!exit.success()) {
      return absl::InternalError("coordinator stopped with " + exit.ToString());
    }
  }
  return StartCoordinatorOn(address);
}

std::vector<std::string> Cluster::CoordinatorArgs() const {
  std::vector<std::string> args = {"--state-dir=" + dir_ + "/state", "--heartbeat-interval=500ms"};
  args.insert(args.end(), coordinator_args_.begin(), coordinator_args_.end());
  return args;
}

absl::Status Cluster::StartStandbyCoordinator() {
  const std::string name = standbys_.empty()
                               ? std::string("coordinator-standby")
                               : absl::StrCat("coordinator-standby-", standbys_.size() + 1);
  auto s = StartStandbyOn(name, host_ + ":0");
  if (!s.ok()) return s.status();
  standbys_.push_back(*std::move(s));
  return absl::OkStatus();
}

absl::StatusOr<Service> Cluster::StartStandbyOn(const std::string& name,
                                                const std::string& listen) {
  return Start(name, "shoal-coordinator", CoordinatorArgs(), listen, "", "coordinator");
}

absl::StatusOr<absl::Duration> Cluster::KillCoordinatorForStandby(absl::Duration timeout) {
  if (standbys_.empty()) return absl::FailedPreconditionError("no standby coordinator");
  const absl::Time killed = absl::Now();
  coordinator_.process->Signal(SIGKILL);
  absl::StatusOr<int> serving = WaitForServingStandby(timeout);
  if (!serving.ok()) return serving.status();
  const absl::Duration took = absl::Now() - killed;
  SHOAL_RETURN_IF_ERROR(PromoteStandby(*serving));
  return took;
}

absl::Status Cluster::PromoteStandby(int index) {
  std::swap(coordinator_, standbys_.at(index));
  control_ = cv1::ControlService::NewStub(rpc::MakeChannel(coordinator_.address, credentials_));
  Service& dead = standbys_[index];
  SHOAL_RETURN_IF_ERROR(dead.process->Wait(absl::Seconds(10)).status());
  // Held until RestartStandby, so that no test running beside this one is handed the port.
  const int port = std::stoi(dead.address.substr(dead.address.rfind(':') + 1));
  absl::StatusOr<ReservedPort> hold = ReservedPort::Reserve(port);
  if (!hold.ok()) return hold.status();
  held_ports_.insert_or_assign(dead.address, *std::move(hold));
  return absl::OkStatus();
}

void Cluster::FollowStepDown() {
  if (standbys_.empty() || coordinator_.process == nullptr || coordinator_.process->Running()) {
    return;
  }
  const std::optional<int> serving = ServingStandby(nullptr);
  if (!serving.has_value()) return;  // none yet: the call fails, and the caller's wait polls again
  const std::string from = coordinator_.address;
  if (absl::Status s = PromoteStandby(*serving); !s.ok()) {
    ADD_FAILURE() << "following the coordinator's successor: " << s;
    return;
  }
  ++step_downs_followed_;
  std::printf("the coordinator at %s stepped down; %s serves in its place\n", from.c_str(),
              coordinator_.address.c_str());
}

absl::Status Cluster::RestartStandby(int index) {
  Service& standby = standbys_.at(index);
  if (standby.process->Running()) {
    return absl::FailedPreconditionError(standby.process->name() + " is running");
  }
  auto s = StartStandbyOn(standby.process->name(), standby.address);
  if (!s.ok()) return s.status();
  held_ports_.erase(standby.address);
  standby = *std::move(s);
  return absl::OkStatus();
}

std::optional<int> Cluster::ServingStandby(std::string* last) {
  for (size_t i = 0; i < standbys_.size(); ++i) {
    if (!standbys_[i].process->Running()) continue;
    // Without the channel's retries, so that the probe answers at once.
    auto probe =
        cv1::ControlService::NewStub(rpc::MakeProbeChannel(standbys_[i].address, credentials_));
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(2));
    context.set_wait_for_ready(true);  // see WaitForCoordinatorServing
    cv1::ListTasksResponse response;
    const absl::Status s =
        rpc::FromGrpcStatus(probe->ListTasks(&context, cv1::ListTasksRequest(), &response));
    if (s.ok()) return static_cast<int>(i);
    if (last != nullptr) *last = absl::StrCat(standbys_[i].address, ": ", s.ToString());
  }
  return std::nullopt;
}

absl::StatusOr<int> Cluster::WaitForServingStandby(absl::Duration timeout) {
  std::optional<int> serving;
  std::string last;
  const auto any_serving = [&] {
    serving = ServingStandby(&last);
    return serving.has_value();
  };
  if (WaitUntil(any_serving, Scaled(timeout), absl::Milliseconds(50))) return *serving;
  return absl::DeadlineExceededError(absl::StrCat("no standby coordinator serves after ",
                                                  absl::FormatDuration(timeout), " (last: ", last,
                                                  ")\n", LogTails()));
}

absl::Status Cluster::WaitForCoordinatorServing(absl::Duration timeout) {
  // Without the channel's retries, so that each poll answers at once.
  auto probe =
      cv1::ControlService::NewStub(rpc::MakeProbeChannel(coordinator_.address, credentials_));
  absl::Status last;
  const auto serving = [&] {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(2));
    // Waits for the connection within the call's deadline: a call that fails at once, while
    // the channel is in TRANSIENT_FAILURE (its first attempt refused while the coordinator
    // moved from its standby listener to its services), leaves nothing in this process to
    // drive the next attempt's TCP and TLS handshakes but gRPC's backup poller, every 5 s:
    // the coordinator answered only 15 to 20 s after it listened.
    context.set_wait_for_ready(true);
    cv1::ListTasksResponse response;
    last = rpc::FromGrpcStatus(probe->ListTasks(&context, cv1::ListTasksRequest(), &response));
    return last.ok();
  };
  if (WaitUntil(serving, Scaled(timeout), absl::Milliseconds(50))) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("the coordinator at ", coordinator_.address,
                                                  " does not serve: ", last.ToString(), "\n",
                                                  LogTails()));
}

std::string Cluster::CoordinatorAddresses() const {
  std::string addresses = coordinator_.address;
  for (const Service& s : standbys_) absl::StrAppend(&addresses, ",", s.address);
  return addresses;
}

absl::Status Cluster::StartCoordinatorOn(const std::string& listen) {
  auto s = Start("coordinator", "shoal-coordinator", CoordinatorArgs(), listen);
  if (!s.ok()) return s.status();
  coordinator_ = *std::move(s);
  if (credentials_ == nullptr) return absl::InternalError("no client certificate");
  control_ = cv1::ControlService::NewStub(rpc::MakeChannel(coordinator_.address, credentials_));
  return absl::OkStatus();
}

absl::Status Cluster::StartAggregator() {
  // The first one is "aggregator" (its certificate name too), later ones "aggregator-1", ...
  const std::string name = aggregators_.empty() ? std::string("aggregator")
                                                : absl::StrCat("aggregator-", aggregators_.size());
  auto s = Start(name, "shoal-aggregator", {"--coordinator=" + CoordinatorAddresses()});
  if (!s.ok()) return s.status();
  aggregators_.push_back(*std::move(s));
  return absl::OkStatus();
}

absl::Status Cluster::StartPeer(int index, int count, std::vector<std::string> extra_args) {
  return StartSharedDataPeer("shoal-peer", index, count, "", std::move(extra_args));
}

absl::Status Cluster::StartPeers(int first, int n, int count, std::vector<std::string> extra_args) {
  // Every process is launched before the first address file is awaited: their start-ups
  // (LibTorch's, the capacity probe, the data) overlap. A failed launch still waits for the
  // ones launched before it, so that each is owned (and stopped) by the cluster.
  std::vector<std::pair<int, Launched>> launched;
  absl::Status status;
  for (int i = first; i < first + n && status.ok(); ++i) {
    auto [binary, args] = Paced("shoal-peer", extra_args);
    auto l = Launch(absl::StrCat("peer-", i), binary, SharedDataPeerArgs(i, count, args));
    if (l.ok()) {
      launched.emplace_back(i, *std::move(l));
    } else {
      status = l.status();
    }
  }
  for (auto& [i, l] : launched) {
    auto s = WaitForAddresses(std::move(l));
    if (!s.ok()) {
      status.Update(s.status());
      continue;
    }
    peers_[i] = *std::move(s);
  }
  return status;
}

std::vector<std::string> Cluster::SharedDataPeerArgs(int index, int count,
                                                     std::vector<std::string> extra_args) const {
  for (std::string& arg : extra_args) {
    arg = absl::StrReplaceAll(arg, {{"{index}", absl::StrCat(index)}});
  }
  extra_args.push_back("--coordinator=" + CoordinatorAddresses());
  extra_args.push_back("--data-dir=/usr/share/datasets/fashion-mnist");
  extra_args.push_back(absl::StrCat("--shard=", index, "/", count));
  extra_args.push_back(absl::StrCat("--name=peer-", index));
  return extra_args;
}

absl::Status Cluster::StartTestPeer(int index, int count, std::vector<std::string> extra_args) {
  return StartSharedDataPeer("shoal-peer-testing", index, count, "", std::move(extra_args));
}

absl::Status Cluster::StartPeerInNetns(int index, int count, const std::string& netns,
                                       std::vector<std::string> extra_args) {
  return StartSharedDataPeer("shoal-peer", index, count, netns, std::move(extra_args));
}

std::pair<std::string, std::vector<std::string>> Cluster::Paced(
    std::string binary, std::vector<std::string> extra_args) const {
  if (batch_floor_ms_ <= 0 || binary != "shoal-peer") return {binary, extra_args};
  extra_args.push_back(absl::StrCat("--test-slow-batch=", batch_floor_ms_));
  return {"shoal-peer-testing", extra_args};
}

absl::Status Cluster::StartSharedDataPeer(const std::string& binary, int index, int count,
                                          const std::string& netns,
                                          std::vector<std::string> extra_args) {
  auto [paced_binary, args] = Paced(binary, std::move(extra_args));
  auto s = Start(absl::StrCat("peer-", index), paced_binary,
                 SharedDataPeerArgs(index, count, std::move(args)),
                 netns.empty() ? "" : "127.0.0.1:0", netns);
  if (!s.ok()) return s.status();
  peers_[index] = *std::move(s);
  return absl::OkStatus();
}

absl::Status Cluster::StartOwnDataPeer(int index, const std::string& data_dir,
                                       std::vector<std::string> extra_args) {
  extra_args.push_back("--coordinator=" + CoordinatorAddresses());
  extra_args.push_back("--data-dir=" + data_dir);
  extra_args.push_back(absl::StrCat("--name=peer-", index));
  auto s = Start(absl::StrCat("peer-", index), "shoal-peer", std::move(extra_args));
  if (!s.ok()) return s.status();
  peers_[index] = *std::move(s);
  return absl::OkStatus();
}

absl::Status Cluster::CreateTask(const common::v1::TaskSpec& spec) {
  FollowStepDown();
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(10));
  cv1::CreateTaskRequest request;
  *request.mutable_spec() = spec;
  cv1::CreateTaskResponse response;
  return rpc::FromGrpcStatus(control_->CreateTask(&context, request, &response));
}

absl::StatusOr<cv1::TaskStatus> Cluster::Status(const std::string& task) {
  FollowStepDown();
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(5));
  cv1::GetTaskStatusRequest request;
  request.set_name(task);
  cv1::GetTaskStatusResponse response;
  absl::Status s = rpc::FromGrpcStatus(control_->GetTaskStatus(&context, request, &response));
  if (!s.ok()) return s;
  return response.status();
}

absl::StatusOr<cv1::ListNodesResponse> Cluster::Nodes() {
  FollowStepDown();
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(5));
  cv1::ListNodesResponse response;
  absl::Status s =
      rpc::FromGrpcStatus(control_->ListNodes(&context, cv1::ListNodesRequest(), &response));
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<cv1::TaskStatus> Cluster::WaitFor(
    const std::string& task, const std::function<bool(const cv1::TaskStatus&)>& pred,
    absl::Duration timeout, const std::string& what) {
  absl::StatusOr<cv1::TaskStatus> last;
  bool ended = false;  // before `pred` held: an ended task does not change any more
  const auto holds = [&] {
    last = Status(task);
    if (!last.ok()) return false;
    if (pred(*last)) return true;
    ended = last->state() != cv1::TASK_STATE_RUNNING && last->state() != cv1::TASK_STATE_WAITING;
    return ended;
  };
  const bool stopped_waiting = WaitUntil(holds, timeout, absl::Milliseconds(100));
  if (stopped_waiting && !ended) return last;
  const std::string seen =
      last.ok() ? last->ShortDebugString() : std::string(last.status().message());
  if (ended) {
    return absl::FailedPreconditionError(
        absl::StrCat("the task ended before ", what, "; last status: ", seen, "\n", LogTails()));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("timed out waiting for ", what, "; last status: ", seen, "\n", LogTails()));
}

absl::StatusOr<cv1::TaskStatus> Cluster::WaitForEnd(const common::v1::TaskSpec& spec) {
  return WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        return s.state() != cv1::TASK_STATE_RUNNING && s.state() != cv1::TASK_STATE_WAITING;
      },
      TaskBound(spec), "the end of the task");
}

absl::Duration Cluster::TaskBound(const common::v1::TaskSpec& spec) {
  return absl::Seconds(static_cast<int64_t>(spec.rounds()) * spec.round_deadline_seconds()) +
         absl::Minutes(1);
}

absl::Status Cluster::WaitForPeersConnected(int count, absl::Duration timeout) {
  const std::string want = absl::StrCat("shoal_coordinator_peers_connected ", count, "\n");
  const auto connected = [&] {
    absl::StatusOr<std::string> metrics = HttpGet(coordinator_.metrics_address, "/metrics");
    return metrics.ok() && metrics->find(want) != std::string::npos;
  };
  if (WaitUntil(connected, timeout, absl::Milliseconds(100))) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("fewer than ", count, " peers connected\n", LogTails()));
}

std::string Cluster::LogTails() {
  std::string out;
  auto add = [&](Service& s) {
    if (s.process) {
      absl::StrAppend(&out, "--- ", s.process->name(), " ---\n", s.process->LogTail(15));
    }
  };
  add(coordinator_);
  for (Service& s : standbys_) add(s);
  for (Service& a : aggregators_) add(a);
  for (auto& [i, s] : peers_) add(s);
  return out;
}

common::v1::TaskSpec SmallTask(const std::string& name) {
  common::v1::TaskSpec spec;
  spec.set_name(name);
  spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
  spec.set_model("mlp");
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.mutable_dataset()->set_train_limit(6000);
  spec.mutable_dataset()->set_test_limit(1000);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_round_batches(20);
  spec.set_rounds(6);
  spec.set_min_participants(2);
  spec.set_round_deadline_seconds(20);
  spec.set_aggregation(common::v1::AGGREGATION_MEAN);
  spec.set_seed(7);
  return spec;
}

}  // namespace shoal::testing
