#include "tests/testing/etcd_member.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/etcd/etcd_kv.h"
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

}  // namespace

EtcdMember::~EtcdMember() { Kill(); }

void EtcdMember::Kill() {
  if (process_ != nullptr) process_->Stop(absl::ZeroDuration());
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

absl::StatusOr<std::unique_ptr<EtcdMember>> EtcdMember::Start(const std::string& dir) {
  const std::string binary = FindEtcd();
  if (binary.empty()) {
    return absl::NotFoundError(
        "no etcd binary on PATH (Debian's etcd-server; scripts/bootstrap test installs it)");
  }
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<ReservedPort> client = ReservedPort::Reserve();
    absl::StatusOr<ReservedPort> peer = ReservedPort::Reserve();
    if (!client.ok()) return client.status();
    if (!peer.ok()) return peer.status();
    const std::string client_url = absl::StrCat("http://", client->address());
    const std::string peer_url = absl::StrCat("http://", peer->address());
    const std::string data_dir = absl::StrCat(dir, "/etcd-", attempt);
    auto member = std::unique_ptr<EtcdMember>(new EtcdMember());
    member->endpoint_ = client->address();
    // etcd binds without SO_REUSEPORT: the ports are released just before it starts.
    client->Release();
    peer->Release();
    process::ProcessOptions options;
    options.name = "etcd";
    options.binary = binary;
    options.args = {"--name",
                    "test",
                    "--data-dir",
                    data_dir,
                    "--listen-client-urls",
                    client_url,
                    "--advertise-client-urls",
                    client_url,
                    "--listen-peer-urls",
                    peer_url,
                    "--initial-advertise-peer-urls",
                    peer_url,
                    "--initial-cluster",
                    absl::StrCat("test=", peer_url),
                    "--logger",
                    "zap",
                    "--log-level",
                    "warn"};
    options.log_path = absl::StrCat(dir, "/etcd-", attempt, ".log");
    member->options_ = options;
    absl::StatusOr<std::unique_ptr<process::Process>> started =
        process::Process::Start(std::move(options));
    if (!started.ok()) return started.status();
    member->process_ = *std::move(started);
    const int port = client->port();
    WaitUntil([&] { return AcceptsConnections(port) || !member->process_->Running(); },
              absl::Seconds(15));
    absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
        etcd::EtcdKv::Connect({member->endpoint_}, Scaled(absl::Seconds(15)), absl::Seconds(5));
    if (kv.ok()) return member;
    last = absl::UnavailableError(absl::StrCat("etcd at ", member->endpoint_, " did not come up (",
                                               kv.status().message(), "); its log:\n",
                                               member->process_->LogTail()));
    member->Kill();
  }
  return last;
}

}  // namespace shoal::testing
