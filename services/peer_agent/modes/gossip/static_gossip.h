#pragma once

// Gossip without a coordinator: the members come from a dpwa user's YAML config, unchanged
// (shoal-peer --dpwa-config FILE --dpwa-node NAME --task-file FILE ...), or from a Kademlia
// DHT joined through any one member (shoal-peer --dht-listen HOST:PORT --dht-bootstrap
// HOST:PORT --task-file FILE --tls-dir DIR ...; gossip_membership.h).

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/discovery/discovery.h"
#include "libs/metrics/metrics_server.h"
#include "libs/rpc/pacer.h"
#include "libs/rpc/retry.h"
#include "libs/rpc/server.h"
#include "libs/rpc/tls.h"
#include "libs/training/partition.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/peer_hooks.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

struct StaticGossipOptions {
  std::string dpwa_config;    // --dpwa-config: dpwa's YAML (nodes, fetch_probability, ...)
  std::string node;           // --dpwa-node: this peer's name in `nodes`
  std::string dht_listen;     // --dht-listen: instead of --dpwa-config, discovery through a DHT
  std::string dht_bootstrap;  // --dht-bootstrap: DHT nodes to join through (HOST:PORT,...)
  int dht_min_members = 2;    // --dht-min-members: train once this many members are known
  std::string task_file;      // --task-file: model, data, optimizer, rounds x round_batches steps;
                              // the YAML's gossip settings override the task's `gossip`
  std::string data_dir;       // --data-dir
  std::string model_dir;      // --model-dir; default: the task file's directory
  // --shard; default: the node's index in `nodes` / the number of nodes (with the DHT: 0/1).
  std::optional<training::ShardSpec> shard;
  // --listen; default: the node's host:port from the config (with the DHT: 127.0.0.1:0;
  // the bound address is announced, so it must be one the other peers reach).
  std::string listen;
  std::string metrics_listen = "127.0.0.1:0";  // --metrics-listen
  std::string address_file;                    // --address-file (optional)
  std::string device = "cpu";                  // --device
  int torch_threads = 1;                       // --torch-threads
  rpc::TlsOptions tls;                         // --tls-dir DIR | --insecure
  // --serve-pacing: a rate paces the snapshots served; "auto" does not here (nothing measures
  // the upload without a coordinator).
  rpc::PacingSetting serve_pacing;
  std::string final_model_out;  // --final-model-out: write the final model here (model file)
  std::string report_out;       // --report-out: write a JSON summary here when done
  bool exit_when_done = false;  // --exit-when-done: exit after the report (default: keep serving)
  PeerHooks hooks;              // empty in shoal-peer; its test build sets them (peer_hooks.h)
};

// The static gossip peer: loads the task and the data, serves PeerService and /metrics, and runs
// the gossip runner with the members its Discovery reports (the YAML's nodes, peer id = node
// name; or the DHT's verified announcements, peer id = the certificate's common name).
// When the steps are done it evaluates, writes the optional report and final model, and keeps
// serving its final snapshot until a shutdown signal (or exits with --exit-when-done).
// Owned by main(); thread-safe.
class StaticGossipPeer {
 public:
  // Errors: INVALID_ARGUMENT / NOT_FOUND naming the flag or the file and key at fault.
  static absl::StatusOr<std::unique_ptr<StaticGossipPeer>> Start(
      const StaticGossipOptions& options);
  ~StaticGossipPeer();

  // Blocks until a shutdown signal (or done, with exit_when_done), then shuts down. Returns the
  // exit code: 0, or 1 when training failed.
  int Run();
  void Shutdown();

  const std::string& address() const { return server_->address(); }
  const std::string& metrics_address() const { return metrics_server_->address(); }

 private:
  StaticGossipPeer() = default;
  void Work();
  bool ReadyToStart() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || other_members_ + 1 >= start_members_;
  }
  void OnMessage(const coordinator::v1::PeerMessage& m) ABSL_LOCKS_EXCLUDED(mu_);
  // From the Discovery (its thread): hands the members to the runner.
  void OnMembers(const std::vector<discovery::Member>& members) ABSL_LOCKS_EXCLUDED(mu_);

  const Clock& clock_ = RealClock::Get();
  rpc::Wakeup wakeup_{clock_};  // notified on Shutdown: the runner's waits end at once
  StaticGossipOptions options_;
  common::v1::TaskSpec spec_;
  std::string peer_id_;
  size_t start_members_ = 1;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<PeerMetrics> metrics_;
  SnapshotStore snapshots_;
  std::unique_ptr<rpc::Pacer> pacer_;  // the snapshots served (outlives the server)
  std::unique_ptr<PeerServiceImpl> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<GrpcPeerClient> peer_client_;
  std::unique_ptr<training::Trainer> trainer_;
  std::unique_ptr<ModeRunner> runner_;
  std::unique_ptr<discovery::Discovery> discovery_;  // stopped before runner_ goes
  std::thread worker_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  size_t other_members_ ABSL_GUARDED_BY(mu_) = 0;
  coordinator::v1::GossipProgress last_progress_ ABSL_GUARDED_BY(mu_);
  std::optional<coordinator::v1::EvalReport> eval_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::peer
