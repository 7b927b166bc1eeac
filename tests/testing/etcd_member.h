#pragma once

// A real etcd (Debian's etcd-server) as a child process for tests: one member on 127.0.0.1 with
// its data in a test directory, killed when the object goes; or several members forming one
// cluster. Its ports are reserved and released just before etcd binds them; a start that loses
// a port to another test is retried.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/shoalctl/process.h"

namespace shoal::testing {

class EtcdMember {
 public:
  // Starts `etcd` (found on PATH, or $SHOAL_ETCD) in `dir` and waits until it answers. With
  // `tls_dir` (ca.crt, tls.crt, tls.key as scripts/gen-certs makes them) its client API is
  // https and requires a client certificate signed by that CA. Errors: NOT_FOUND without an
  // etcd binary (scripts/bootstrap test installs etcd-server); UNAVAILABLE when it did not come
  // up, with the end of its log.
  static absl::StatusOr<std::unique_ptr<EtcdMember>> Start(const std::string& dir,
                                                           const std::string& tls_dir = "");
  // `count` members forming one cluster (etcd's --initial-cluster), each as Start's; returns once
  // the cluster has a leader and takes writes. Errors: as Start's.
  static absl::StatusOr<std::vector<std::unique_ptr<EtcdMember>>> StartCluster(
      const std::string& dir, int count, const std::string& tls_dir = "");

  // Kills etcd: a graceful stop waits for the clients' connections to close (seconds), and the
  // data directory is a test's.
  ~EtcdMember();
  void Kill();
  // Kills etcd and starts it again on the same ports and data (a member that was down comes
  // back); returns once it accepts connections.
  absl::Status Restart();
  // Sends `sig` to etcd (SIGSTOP: a member that hangs, its connections open; SIGCONT). After
  // SIGSTOP it returns once every thread of etcd is stopped (at most 5 s).
  void Signal(int sig);

  const std::string& endpoint() const { return endpoint_; }  // HOST:PORT of its client API
  pid_t pid() const { return process_->pid(); }
  // Whether this member leads its cluster now (its etcd_server_is_leader metric).
  bool IsLeader() const;

 private:
  process::ProcessOptions options_;  // of the running etcd, for Restart
  std::unique_ptr<process::Process> process_;
  std::string endpoint_;
  std::string metrics_endpoint_;  // HOST:PORT of its plain HTTP /metrics
};

// The members' endpoints as a comma list, for --store etcd://A,B,C/PREFIX.
std::string Endpoints(const std::vector<std::unique_ptr<EtcdMember>>& members);
// Every member's endpoint, member `first`'s first (the one a client asks first).
std::vector<std::string> EndpointsFrom(const std::vector<std::unique_ptr<EtcdMember>>& members,
                                       size_t first);
// The first member that is (`leader`) or is not its cluster's leader; size() when none.
size_t FirstMember(const std::vector<std::unique_ptr<EtcdMember>>& members, bool leader);

}  // namespace shoal::testing
