#pragma once

#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::peer {

// gRPC adapter for PeerService: streams the latest published snapshot. Owned by the PeerServer;
// the store and metrics must outlive it. Thread-safe (handlers only read the store).
class PeerServiceImpl final : public shoal::peer::v1::PeerService::CallbackService {
 public:
  PeerServiceImpl(const SnapshotStore& store, PeerMetrics& metrics)
      : store_(store), metrics_(metrics) {}

  grpc::ServerWriteReactor<common::v1::ModelChunk>* GetSnapshot(
      grpc::CallbackServerContext* context,
      const shoal::peer::v1::GetSnapshotRequest* request) override;

 private:
  const SnapshotStore& store_;
  PeerMetrics& metrics_;
};

}  // namespace shoal::peer
