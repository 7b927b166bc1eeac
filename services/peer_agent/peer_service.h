#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "libs/rpc/pacer.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::peer {

struct PeerServiceOptions {
  // This peer's id for ProbeResponse (empty before the coordinator's Welcome). Optional.
  std::function<std::string()> peer_id;
  // Paces the snapshots served at this peer's uplink (rpc::Pacer; its rate 0: not paced), in
  // messages of Pacer::MessageBytes. Optional; must outlive the service.
  rpc::Pacer* pacer = nullptr;
};

// gRPC adapter for PeerService: streams the published snapshot of the kind asked for, answers
// Probe. Owned by the PeerServer; the store and metrics must outlive it. Thread-safe (handlers
// only read the store). GetSnapshot is registered raw: chunks go out as slices of the snapshot's
// own memory (rpc::ModelWriteReactor).
class PeerServiceImpl final
    : public shoal::peer::v1::PeerService::WithRawCallbackMethod_GetSnapshot<
          shoal::peer::v1::PeerService::CallbackService> {
 public:
  PeerServiceImpl(const SnapshotStore& store, PeerMetrics& metrics, PeerServiceOptions options = {})
      : store_(store), metrics_(metrics), options_(std::move(options)) {}

  // Errors: INVALID_ARGUMENT an unknown kind;
  // NOT_FOUND no snapshot of that kind (yet) or another task; FAILED_PRECONDITION a
  // ROUND_UPDATE/GLOBAL of another round than the one asked for.
  // A GetSnapshotRequest that does not parse: INVALID_ARGUMENT.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetSnapshot(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request) override;

  grpc::ServerUnaryReactor* Probe(grpc::CallbackServerContext* context,
                                  const shoal::peer::v1::ProbeRequest* request,
                                  shoal::peer::v1::ProbeResponse* response) override;

 private:
  const SnapshotStore& store_;
  PeerMetrics& metrics_;
  const PeerServiceOptions options_;
  std::atomic<double> logged_rate_{0};  // the pacing rate last logged (0: unpaced)
};

}  // namespace shoal::peer
