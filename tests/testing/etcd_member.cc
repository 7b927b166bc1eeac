#include "tests/testing/etcd_member.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/etcd/etcd_kv.h"
#include "libs/rpc/tls.h"
#include "tests/testing/http_get.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

// $SHOAL_ETCD, or the first `etcd` on PATH.
std::string FindEtcd() {
  if (const char* env = std::getenv("SHOAL_ETCD"); env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "" : path, ':')) {
    std::string candidate = absl::StrCat(dir, "/etcd");
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Whether every thread of `pid` is stopped (state T or t in /proc/PID/task/TID/stat).
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  bool any = false;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "TID (COMM) STATE ...": the state follows the last ')', as COMM may hold one.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) return false;
    if (stat[close + 2] != 'T' && stat[close + 2] != 't') return false;
    any = true;
  }
  return any && !ec;
}

}  // namespace

EtcdMember::~EtcdMember() { Kill(); }

void EtcdMember::Kill() {
  if (process_ != nullptr) process_->Stop(absl::ZeroDuration());
}

void EtcdMember::Signal(int sig) {
  if (process_ == nullptr) return;
  process_->Signal(sig);
  if (sig == SIGSTOP) {
    // Sent is not stopped: a member that runs on for a moment still answers a heartbeat, which
    // can confirm the leader's next read (a test of a leader without its quorum then sees one).
    WaitUntil([&] { return AllThreadsStopped(process_->pid()); }, absl::Seconds(5));
  }
}

absl::Status EtcdMember::Restart() {
  Kill();
  process::ProcessOptions options = options_;
  options.log_path += ".restarted";
  absl::StatusOr<std::unique_ptr<process::Process>> started = process::Process::Start(options);
  if (!started.ok()) return started.status();
  process_ = *std::move(started);
  const int port = std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1));
  if (!WaitUntil([&] { return AcceptsConnections(port) || !process_->Running(); },
                 Scaled(absl::Seconds(15))) ||
      !process_->Running()) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", endpoint_, " did not come back; its log:\n", process_->LogTail()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EtcdMember>> EtcdMember::Start(const std::string& dir,
                                                              const std::string& tls_dir) {
  absl::StatusOr<std::vector<std::unique_ptr<EtcdMember>>> members = StartCluster(dir, 1, tls_dir);
  if (!members.ok()) return members.status();
  return std::move(members->front());
}

absl::StatusOr<std::vector<std::unique_ptr<EtcdMember>>> EtcdMember::StartCluster(
    const std::string& dir, int count, const std::string& tls_dir) {
  std::shared_ptr<grpc::ChannelCredentials> client;  // the readiness check's, with TLS
  if (!tls_dir.empty()) {
    absl::StatusOr<rpc::Credentials> credentials = rpc::Credentials::Create({.dir = tls_dir});
    if (!credentials.ok()) return credentials.status();
    client = credentials->channel();
  }
  const std::string binary = FindEtcd();
  if (binary.empty()) {
    return absl::NotFoundError(
        "no etcd binary on PATH (Debian's etcd-server; scripts/bootstrap test installs it)");
  }
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    // Each member's client port, its peer port and its metrics port.
    std::vector<ReservedPort> ports;
    for (int i = 0; i < 3 * count; ++i) {
      absl::StatusOr<ReservedPort> port = ReservedPort::Reserve();
      if (!port.ok()) return port.status();
      ports.push_back(*std::move(port));
    }
    std::vector<std::string> initial_cluster;
    for (int i = 0; i < count; ++i) {
      initial_cluster.push_back(absl::StrCat("m", i, "=http://", ports[3 * i + 1].address()));
    }
    std::vector<std::unique_ptr<EtcdMember>> members;
    std::vector<std::string> endpoints;
    // etcd binds without SO_REUSEPORT: the ports are released just before it starts.
    for (ReservedPort& port : ports) port.Release();
    for (int i = 0; i < count; ++i) {
      const std::string client_url =
          absl::StrCat(tls_dir.empty() ? "http://" : "https://", ports[3 * i].address());
      const std::string peer_url = absl::StrCat("http://", ports[3 * i + 1].address());
      auto member = std::unique_ptr<EtcdMember>(new EtcdMember());
      member->endpoint_ = ports[3 * i].address();
      member->metrics_endpoint_ = ports[3 * i + 2].address();
      process::ProcessOptions options;
      options.name = absl::StrCat("etcd-", i);
      options.binary = binary;
      options.args = {"--name",
                      absl::StrCat("m", i),
                      "--data-dir",
                      absl::StrCat(dir, "/etcd-", i, "-", attempt),
                      "--listen-client-urls",
                      client_url,
                      "--advertise-client-urls",
                      client_url,
                      "--listen-peer-urls",
                      peer_url,
                      "--initial-advertise-peer-urls",
                      peer_url,
                      "--initial-cluster",
                      absl::StrJoin(initial_cluster, ","),
                      "--listen-metrics-urls",
                      absl::StrCat("http://", ports[3 * i + 2].address()),
                      "--logger",
                      "zap",
                      "--log-level",
                      "warn"};
      if (!tls_dir.empty()) {
        options.args.insert(options.args.end(), {"--cert-file", tls_dir + "/tls.crt", "--key-file",
                                                 tls_dir + "/tls.key", "--trusted-ca-file",
                                                 tls_dir + "/ca.crt", "--client-cert-auth"});
      }
      options.log_path = absl::StrCat(dir, "/etcd-", i, "-", attempt, ".log");
      member->options_ = options;
      absl::StatusOr<std::unique_ptr<process::Process>> started =
          process::Process::Start(std::move(options));
      if (!started.ok()) return started.status();
      member->process_ = *std::move(started);
      endpoints.push_back(member->endpoint_);
      members.push_back(std::move(member));
    }
    // Up once every member listens and the cluster takes a write (it has elected a leader).
    const auto listening = [&] {
      for (int i = 0; i < count; ++i) {
        if (!AcceptsConnections(ports[3 * i].port()) && members[i]->process_->Running()) {
          return false;
        }
      }
      return true;
    };
    WaitUntil(listening, absl::Seconds(15));
    absl::Status written;
    absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
        etcd::EtcdKv::Connect(endpoints, Scaled(absl::Seconds(15)), absl::Seconds(2), client);
    if (kv.ok()) {
      WaitUntil([&] { return (written = (*kv)->Put("/etcd-member-ready", "")).ok(); },
                absl::Seconds(15), absl::Milliseconds(50));
    }
    if (kv.ok() && written.ok()) return members;
    std::string logs;
    for (const auto& member : members) {
      absl::StrAppend(&logs, "--- ", member->options_.name, " ---\n", member->process_->LogTail());
    }
    last = absl::UnavailableError(
        absl::StrCat("etcd at ", absl::StrJoin(endpoints, ","), " did not come up (",
                     kv.ok() ? written.message() : kv.status().message(), "); the logs:\n", logs));
  }
  return last;
}

bool EtcdMember::IsLeader() const {
  absl::StatusOr<std::string> metrics = HttpGet(metrics_endpoint_, "/metrics");
  return metrics.ok() && MetricValue(*metrics, "etcd_server_is_leader") == 1;
}

std::string Endpoints(const std::vector<std::unique_ptr<EtcdMember>>& members) {
  std::vector<std::string> endpoints;
  for (const auto& member : members) endpoints.push_back(member->endpoint());
  return absl::StrJoin(endpoints, ",");
}

std::vector<std::string> EndpointsFrom(const std::vector<std::unique_ptr<EtcdMember>>& members,
                                       size_t first) {
  std::vector<std::string> endpoints = {members[first]->endpoint()};
  for (size_t i = 0; i < members.size(); ++i) {
    if (i != first) endpoints.push_back(members[i]->endpoint());
  }
  return endpoints;
}

size_t FirstMember(const std::vector<std::unique_ptr<EtcdMember>>& members, bool leader) {
  size_t i = 0;
  while (i < members.size() && members[i]->IsLeader() != leader) ++i;
  return i;
}

}  // namespace shoal::testing
