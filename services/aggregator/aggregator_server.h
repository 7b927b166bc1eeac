#pragma once

#include <grpcpp/client_context.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/common/executor.h"
#include "libs/metrics/metrics_server.h"
#include "libs/rpc/address_list.h"
#include "libs/rpc/server.h"
#include "libs/rpc/tls.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/aggregator_service.h"
#include "services/aggregator/download_deltas.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/aggregator/relay_hub.h"
#include "services/aggregator/relay_service.h"
#include "shoal/common/v1/capacity.pb.h"

namespace shoal::aggregator {

struct AggregatorOptions {
  std::string listen = "127.0.0.1:7100";
  std::string metrics_listen = "127.0.0.1:9200";
  // HOST:PORT[,HOST:PORT...] of the coordinator's RegistryService (the active coordinator and
  // its standbys, tried in turn: rpc::AddressList); required
  std::string coordinator;
  std::string advertise;     // HOST:PORT peers use to reach us; default: the bound address
  std::string address_file;  // optional: where to write the bound addresses
  int max_concurrent_pushes = 4;
  // Update memory one round or federated-async buffer may hold (AggregatorCoreOptions).
  uint64_t max_buffer_bytes = uint64_t{4} << 30;
  rpc::TlsOptions tls;  // --tls-dir DIR | --insecure
  int executor_threads = 2;
  absl::Duration register_timeout = absl::Seconds(5);
  // --upload-probe-bytes: the timed upload to the coordinator before the first registration
  // (SessionService.MeasureUpload), reported in the capacity; 0: not measured.
  uint64_t upload_probe_bytes = 0;
  // Set by shoal-peer when it runs this aggregator as an elected supernode (--host-peer): the
  // peer's id, sent with every registration (RegisterAggregatorRequest.host_peer).
  std::string host_peer;
  absl::Duration upload_probe_timeout = absl::Seconds(20);
  absl::Duration default_heartbeat_interval = absl::Seconds(2);
  absl::Duration shutdown_grace = absl::Seconds(5);

  // Errors name the flag: INVALID_ARGUMENT "--listen: ...".
  absl::Status Validate() const;
};

// The shoal-aggregator process: owns the metrics endpoint, the core, the executor, the
// download encoder, the gRPC server and the registration thread that keeps announcing this
// aggregator to the coordinator (retrying with backoff while the coordinator is down). Not
// thread-safe: one owner starts it and shuts it down.
class AggregatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<AggregatorServer>> Start(const AggregatorOptions& options);
  ~AggregatorServer();

  const std::string& address() const { return server_->address(); }
  const std::string& metrics_address() const { return metrics_->address(); }
  const std::string& advertised_address() const { return advertise_; }
  prometheus::Registry& registry() { return metrics_->registry(); }
  // True once the coordinator has accepted a registration.
  bool registered() const;

  // Stops registering, drains calls (up to the grace period), then the executor, then abandons
  // the download encodings and joins their thread. Idempotent.
  void Shutdown();

 private:
  AggregatorServer() = default;
  void RegistrationLoop();
  // Times the upload to the coordinator into capacity_; false when it should be tried again
  // (the coordinator could not be reached).
  bool MeasureUpload(const rpc::AddressList::Target& target);

  AggregatorOptions options_;
  std::string advertise_;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;  // for the registration calls
  common::v1::Capacity capacity_;  // measured at Start; the upload by the registration loop
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<AggregatorMetrics> aggregator_metrics_;
  std::unique_ptr<AggregatorCore> core_;
  std::unique_ptr<ThreadPool> executor_;
  // Downloads against a held version: their encodings, made on a thread of their own (apart from
  // the folds and the gRPC threads) as each version is published.
  std::unique_ptr<ThreadPool> encoder_;
  std::unique_ptr<DownloadDeltas> downloads_;
  std::unique_ptr<GrpcAggregatorClient> parents_;  // a tree node's parent (and backups)
  std::unique_ptr<ParentLink> parent_link_;        // partial sums up the tree, over parents_
  std::unique_ptr<AggregatorServiceImpl> service_;
  // Relays for peers behind NAT: their streams, and the PeerService others reach them at.
  std::unique_ptr<RelayHub> relay_hub_;
  std::unique_ptr<RelayServiceImpl> relay_service_;
  std::unique_ptr<RelayPeerServiceImpl> relay_peer_service_;
  std::unique_ptr<rpc::Server> server_;
  std::thread registration_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;  // registration call
  bool shut_down_ = false;
};

}  // namespace shoal::aggregator
