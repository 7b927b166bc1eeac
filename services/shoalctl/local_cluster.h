#pragma once

// A whole Shoal cluster as child processes on 127.0.0.1: one shoal-coordinator, aggregators and
// peers, each on free ports (port 0 + --address-file). Used by `shoalctl local` and by the
// cluster tests.

#include <atomic>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/shoalctl/process.h"

namespace shoal::process {

struct LocalClusterOptions {
  std::string bin_dir;    // holds shoal-coordinator, shoal-aggregator, shoal-peer
  std::string state_dir;  // must exist; coordinator state, address files and logs go here
  std::string data_dir;   // passed to every peer as --data-dir, with --shard I/N
  // Non-empty: each peer I has data of its own, peer_data_dir/peer-I, passed as its --data-dir
  // without --shard (instead of data_dir).
  std::string peer_data_dir;
  int aggregators = 1;                                 // 0 for decentralized and gossip tasks
  int peers = 0;                                       // may be 0: add peers later with StartPeer()
  absl::Duration startup_timeout = absl::Seconds(60);  // per service, until its address file
  // Extra flags for every service of a kind (e.g. {"--heartbeat-interval", "500ms"}).
  std::vector<std::string> coordinator_args;
  std::vector<std::string> aggregator_args;
  std::vector<std::string> peer_args;
  // Mutual TLS by default: certificates from `bin_dir`/shoal-gen-certs go to STATE/certs/NAME
  // and every service gets --tls-dir for its own. `insecure` runs everything plaintext.
  bool insecure = false;
  // Non-empty: the coordinator serves the web console on this HOST:PORT, with an admin token
  // made at random into STATE/console-tokens.
  std::string console_listen;

  absl::Status Validate() const;
};

// One started service.
struct Service {
  std::string name;     // "coordinator", "aggregator-0", "peer-2"
  std::string kind;     // "coordinator" | "aggregator" | "peer"
  std::string address;  // its gRPC HOST:PORT
  std::string metrics_address;
  std::string console_address;  // the coordinator's web console, when it serves one
  std::unique_ptr<Process> process;
};

// Owns the child processes. Start() and StartPeer() must be called from a thread that outlives
// the children (PR_SET_PDEATHSIG follows the starting thread): normally the main thread.
// Poll()/FirstUnexpectedExit() may be called from any thread; Stop() from the owning thread.
// The destructor stops everything.
class LocalCluster {
 public:
  // Starts the coordinator, waits for its address file, then the aggregators, then the peers
  // (all side by side, then waiting for their address files). `progress` (optional) gets one line
  // per service. `abort` (optional) interrupts the startup (CANCELLED). On error everything already
  // started is stopped again; a service that dies during startup is named with the tail of its log.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      LocalClusterOptions options, std::ostream* progress = nullptr,
      const std::atomic<bool>* abort = nullptr);
  ~LocalCluster();

  const std::string& coordinator_address() const { return services_[0].address; }
  // The web console's URL and token file ("" without console_listen).
  std::string ConsoleUrl() const;
  std::string ConsoleTokensPath() const;
  const std::vector<Service>& services() const { return services_; }
  Service* Find(const std::string& name);
  std::string LogPath(const std::string& name) const;
  // The --tls-dir for a client of this cluster (shoalctl, tests); empty when insecure.
  std::string ClientTlsDir() const;
  std::string AddressFilePath(const std::string& name) const;

  // Starts peer `index` of `count` ("peer-<index>", --shard index/count) and waits for its
  // address file. Used by Start() and for late joins.
  absl::Status StartPeer(int index, int count, const std::vector<std::string>& extra_args = {});

  // The first service (in start order) that has exited, not counting those in `ignore`,
  // described as "peer-2 exited unexpectedly (exit code 1); last lines of LOG:\n...".
  std::optional<std::string> FirstUnexpectedExit(const std::vector<std::string>& ignore = {});

  // Stops peers, then aggregators, then the coordinator: SIGTERM, `grace` each, then SIGKILL.
  // Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(10));

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  // Issues each name's certificate (if missing) in one shoal-gen-certs run; nothing when insecure.
  absl::Status MakeCertificates(const std::vector<std::string>& names);
  // Writes ConsoleTokensPath(): one admin token, 24 random bytes as hex (mode 0600).
  absl::Status MakeConsoleTokens();
  absl::Status StartService(const std::string& name, const std::string& kind,
                            const std::string& binary, std::vector<std::string> args,
                            std::ostream* progress, const std::atomic<bool>* abort);
  // StartService() in two halves, so that several services can start side by side: the process
  // with --tls-dir (its certificate already made) or --insecure and --address-file; then the
  // wait for its address file, after which it joins services_ (on failure it is stopped) and
  // `progress` (optional) gets its "started" line.
  absl::StatusOr<Service> LaunchService(const std::string& name, const std::string& kind,
                                        const std::string& binary, std::vector<std::string> args);
  absl::Status AwaitService(Service service, std::ostream* progress,
                            const std::atomic<bool>* abort);
  absl::StatusOr<Service> LaunchPeer(int index, int count,
                                     const std::vector<std::string>& extra_args);

  LocalClusterOptions options_;
  std::vector<Service> services_;  // coordinator first; only the owning thread adds
};

}  // namespace shoal::process
