#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/metrics/metrics_server.h"
#include "libs/rpc/pacer.h"
#include "libs/rpc/server.h"
#include "libs/rpc/tls.h"
#include "libs/training/partition.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/peer_agent.h"
#include "services/peer_agent/peer_hooks.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/relay_link.h"
#include "services/peer_agent/session_client.h"
#include "services/peer_agent/snapshot_store.h"
#include "services/peer_agent/supernode_host.h"

namespace shoal::peer {

// Everything shoal-peer is configured with (main.cc fills it from flags).
struct PeerOptions {
  std::string coordinator;             // --coordinator HOST:PORT[,HOST:PORT...]
  std::string listen = "127.0.0.1:0";  // --listen (PeerService)
  // --advertise: the address other peers reach this one at (Hello.listen_address); empty: the
  // address it actually listens on.
  std::string advertise;
  // --relay HOST:PORT: this peer accepts no inbound connection; it keeps a Relay stream open to
  // the aggregator there and advertises HOST:PORT/NAME (needs --name; excludes --advertise).
  // "auto": the coordinator picks the aggregator (Hello.wants_relay, Welcome.relay_address).
  // Empty (the default): the coordinator picks one when it cannot dial the peer back
  // (Hello.relay_fallback, RelayAssigned). "off": never relayed.
  std::string relay;
  std::string metrics_listen = "127.0.0.1:0";  // --metrics-listen
  std::string data_dir;                        // --data-dir
  std::string model_dir;                       // --model-dir (TorchScript tasks' files)
  std::string scratch_dir;                     // --scratch-dir (empty: TMPDIR, else /tmp)
  std::string state_dir;                       // --state-dir (empty: keep nothing)
  bool evaluate_beside_training = true;        // --evaluate-beside-training
  bool download_against_held = false;          // --download-against-held
  training::ShardSpec shard;                   // --shard I/N (default 0/1: all of it)
  std::string name;                            // --name (empty: the coordinator picks an id)
  std::string device = "cpu";                  // --device cpu|cuda
  std::string address_file;                    // --address-file (optional)
  int torch_threads = 1;                       // --torch-threads
  rpc::TlsOptions tls;                         // --tls-dir DIR | --insecure
  std::string join_token;                      // --join-token (default $SHOAL_JOIN_TOKEN)
  uint64_t upload_probe_bytes = 0;             // --upload-probe-bytes (0: not measured)
  rpc::PacingSetting serve_pacing;             // --serve-pacing (default: auto)
  // --supernode: offer to host an elected supernode (Hello.supernode), run with these options
  // (binary, listen, advertise; the rest is filled from the peer's own).
  bool supernode = false;
  SupernodeHostOptions supernode_host;
  // Empty in shoal-peer; its test build sets them (peer_hooks.h).
  PeerHooks hooks;

  // Checks every field without connecting anywhere: addresses parse, the data directory exists,
  // the scratch directory can hold an unnamed file, the device exists. Errors are INVALID_ARGUMENT
  // (NOT_FOUND for a missing data directory) and start with the flag's name, e.g. "--data-dir:
  // ...".
  absl::Status Validate() const;
};

// The shoal-peer process: loads the data, serves PeerService and /metrics, keeps the session
// with the coordinator and runs the agent. SIGTERM/SIGINT -> Leave, stop, exit 0. Owned by
// main(); Run() is called from the main thread. Thread-safe otherwise.
class PeerServer {
 public:
  // Validates, loads Fashion-MNIST when the data directory holds it (before connecting
  // anywhere; tasks of other formats load their files when assigned), binds the servers, writes
  // the address file and starts the session. Errors name the flag at fault.
  static absl::StatusOr<std::unique_ptr<PeerServer>> Start(const PeerOptions& options);
  ~PeerServer();

  // Blocks until a shutdown signal (or a fatal agent error), then shuts down. Returns the exit
  // code: 0 after a signal, 1 after a fatal error.
  int Run();
  // Leave, stop the agent, stop the servers. Idempotent.
  void Shutdown();

  const std::string& address() const { return server_->address(); }
  const std::string& metrics_address() const { return metrics_server_->address(); }

 private:
  PeerServer() = default;
  void OnFatal(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // BecomeSupernode / RetireSupernode (from the session's reader thread; neither blocks).
  void OnSupernodeEvent(const coordinator::v1::CoordinatorEvent& event) ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<PeerMetrics> metrics_;
  SnapshotStore snapshots_;
  std::unique_ptr<rpc::Pacer> pacer_;  // the snapshots served (outlives the server)
  std::unique_ptr<PeerServiceImpl> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<aggregator::GrpcAggregatorClient> aggregator_client_;
  std::unique_ptr<GrpcPeerClient> peer_client_;
  std::unique_ptr<PeerAgent> agent_;
  std::unique_ptr<SessionClient> session_;
  std::unique_ptr<SupernodeHost> supernode_;  // with --supernode

  // --relay=auto: (re)opens the relay link to `relay` as `id` (from a Welcome).
  void UseRelay(const std::string& relay, const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // A Welcome without a relay for a peer the coordinator relayed before (no aggregator can
  // relay now): closes the link, which would otherwise keep asking for another relay.
  void DropRelay() ABSL_LOCKS_EXCLUDED(mu_);
  // The coordinator could not reach this peer and picked a relay for it: from now on it is
  // relayed as with --relay=auto.
  void OnRelayAssigned(const std::string& relay) ABSL_LOCKS_EXCLUDED(mu_);

  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // for the relay link
  // --relay=auto: a relay whose stream stays down this long is replaced (a new session).
  static constexpr absl::Duration kRelayGiveUp = absl::Seconds(10);

  absl::Mutex mu_;
  std::string peer_id_ ABSL_GUARDED_BY(mu_);      // from the latest Welcome (for Probe answers)
  bool auto_relay_ ABSL_GUARDED_BY(mu_) = false;  // --relay=auto, or after RelayAssigned
  // With --relay; reads snapshots_. Replaced (auto) outside mu_ once swapped out.
  std::unique_ptr<RelayLink> relay_ ABSL_GUARDED_BY(mu_);
  std::string relay_address_ ABSL_GUARDED_BY(mu_);  // and the id it is open for
  std::string relay_id_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::peer
