#pragma once

#include <grpcpp/client_context.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

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
#include "shoal/coordinator/v1/registry.pb.h"

namespace shoal::aggregator {

struct AggregatorOptions {
  std::string listen = "127.0.0.1:7100";
  std::string metrics_listen = "127.0.0.1:9200";
  // HOST:PORT[,HOST:PORT...] of the coordinators' RegistryService: the aggregator registers
  // with each one that serves (rpc::AddressList::Parse); required
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
// download encoder, the gRPC server and the registration threads, one per coordinator address,
// that keep announcing this aggregator to each coordinator that serves (retrying with backoff
// while it is down or a standby). Not
// thread-safe: one owner starts it and shuts it down.
class AggregatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<AggregatorServer>> Start(const AggregatorOptions& options);
  ~AggregatorServer();

  const std::string& address() const { return server_->address(); }
  const std::string& metrics_address() const { return metrics_->address(); }
  const std::string& advertised_address() const { return advertise_; }
  prometheus::Registry& registry() { return metrics_->registry(); }
  // True while a coordinator accepts this aggregator's registrations.
  bool registered() const;

  // Stops registering, drains calls (up to the grace period), then the executor, then abandons
  // the download encodings and joins their thread. Idempotent.
  void Shutdown();

 private:
  AggregatorServer() = default;
  // Keeps this aggregator registered with the coordinator at `address`.
  void RegistrationLoop(std::string address, std::shared_ptr<grpc::Channel> channel);
  // Frees the tasks a registration's answer names (RegisterAggregatorResponse.release) that
  // were not called about since `as_of`, the request's TaskCalls::Held::as_of.
  void ReleaseUnused(const std::string& coordinator,
                     const coordinator::v1::RegisterAggregatorResponse& response, uint64_t as_of);
  // Times the upload to a coordinator into capacity_; false when it should be tried again
  // (the coordinator could not be reached).
  bool MeasureUpload(const std::string& address, const std::shared_ptr<grpc::Channel>& channel);

  AggregatorOptions options_;
  std::string advertise_;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;  // for the registration calls
  common::v1::Capacity capacity_;  // measured at Start; the upload by the registration loop
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<AggregatorMetrics> aggregator_metrics_;
  std::unique_ptr<AggregatorCore> core_;
  std::unique_ptr<ThreadPool> executor_;
  std::unique_ptr<ThreadPool> transfers_;  // calls that wait on a tree node's parent
  // Downloads against a held version: their encodings, made on a thread of their own (apart from
  // the folds and the gRPC threads) as each version is published; each encoding deflates on a
  // thread per core.
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
  std::vector<std::thread> registrations_;  // one per coordinator address

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> registered_at_ ABSL_GUARDED_BY(mu_);  // registration accepted last
  bool upload_measured_ ABSL_GUARDED_BY(mu_) = false;
  bool measuring_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);  // registrations, the probe
  bool shut_down_ = false;
};

}  // namespace shoal::aggregator
