#pragma once

#include <prometheus/gauge.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/tls.h"

namespace shoal::peer {

// How a peer runs its aggregator when it is elected supernode (shoal-peer --supernode).
struct SupernodeHostOptions {
  std::string binary;          // the shoal-aggregator executable (--supernode-binary)
  std::string coordinator;     // HOST:PORT, the peer's own
  std::string listen;          // --supernode-listen: HOST:PORT (port 0: any free port)
  std::string advertise;       // --supernode-advertise: HOST:PORT others use ("" = bound address)
  std::string metrics_listen;  // HOST:PORT for its /metrics (port 0: any free port)
  rpc::TlsOptions tls;         // the peer's: the aggregator presents the peer's certificate
  uint64_t upload_probe_bytes = 0;
  // After SIGTERM, this long before SIGKILL.
  absl::Duration stop_grace = absl::Seconds(10);

  // Errors are INVALID_ARGUMENT naming the flag: an address that does not parse, a binary that
  // is not an executable file.
  absl::Status Validate() const;
};

// The path of shoal-aggregator next to the running executable (/proc/self/exe).
std::string DefaultAggregatorBinary();

// Runs shoal-aggregator as a child process while this peer is an elected supernode: the same
// aggregator code as a dedicated one, in its own process (a crash or a memory limit of the
// aggregator does not take the peer's training with it, and the peer's process keeps one role).
// The aggregator registers with the coordinator naming the peer as its host (--host-peer) and
// ends with the peer: Stop() sends SIGTERM (SIGKILL after the grace), and the kernel sends it
// SIGTERM if the peer dies first (PR_SET_PDEATHSIG). A supervisor thread forks it, waits for it
// and logs how it ended. Thread-safe.
class SupernodeHost {
 public:
  // `running`: set to 1 while the aggregator runs, else 0 (may be null).
  SupernodeHost(SupernodeHostOptions options, prometheus::Gauge* running);
  ~SupernodeHost();  // Stop()s and waits for the aggregator to end
  SupernodeHost(const SupernodeHost&) = delete;
  SupernodeHost& operator=(const SupernodeHost&) = delete;

  // Starts the aggregator for the peer `peer_id`; nothing when one runs already.
  void Start(const std::string& peer_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the aggregator to stop (SIGTERM now, SIGKILL after the grace); does not wait.
  void Stop(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no aggregator runs.
  void Wait() ABSL_LOCKS_EXCLUDED(mu_);
  bool running() const ABSL_LOCKS_EXCLUDED(mu_);

  // The aggregator's command line for `peer_id`, program first.
  std::vector<std::string> CommandLine(const std::string& peer_id) const;

 private:
  void Supervise(std::vector<std::string> args) ABSL_LOCKS_EXCLUDED(mu_);

  const SupernodeHostOptions options_;
  prometheus::Gauge* const running_gauge_;

  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // from Start until the child was reaped
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;         // the child, once forked
  bool stop_ ABSL_GUARDED_BY(mu_) = false;     // Stop() asked since the last Start()
  absl::Time kill_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread supervisor_;  // guarded by start_mu_
  absl::Mutex start_mu_;    // Start, Wait and the destructor, one at a time
};

}  // namespace shoal::peer
