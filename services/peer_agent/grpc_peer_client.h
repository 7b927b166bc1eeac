#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "libs/common/address.h"
#include "libs/rpc/channel_cache.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/peer_metrics.h"

namespace shoal::peer {

// PeerClient over gRPC, with one channel per peer address (rpc::ChannelCache; a peer behind NAT,
// HOST:PORT/PEER_ID, is called at its relay HOST:PORT with relay_to = PEER_ID) secured with this
// peer's TLS client credentials (the channel itself retries UNAVAILABLE while the deadline
// allows). Counts failed fetches, rejected snapshots and pulled bytes in `metrics` (optional;
// must outlive it). Thread-safe. Owned by the PeerServer.
class GrpcPeerClient final : public PeerClient {
 public:
  // `credentials` null = plaintext (tests in one process). `metrics` may be null.
  explicit GrpcPeerClient(std::shared_ptr<grpc::ChannelCredentials> credentials,
                          PeerMetrics* metrics = nullptr)
      : channels_(std::move(credentials)), metrics_(metrics) {}
  GrpcPeerClient(const GrpcPeerClient&) = delete;
  GrpcPeerClient& operator=(const GrpcPeerClient&) = delete;

  absl::StatusOr<tensor::ReceivedModel> Fetch(const std::string& address,
                                              const peer::v1::GetSnapshotRequest& request,
                                              absl::Time deadline,
                                              const tensor::ModelLayout& expected,
                                              CallCanceller* canceller = nullptr,
                                              std::vector<float> buffer = {}) override;
  absl::Status Probe(const std::string& address, const peer::v1::ProbeRequest& request,
                     absl::Time deadline, CallCanceller* canceller = nullptr) override;
  // A relay's channel is shared by the peers it relays for, so it stays.
  void Forget(const std::string& address) override {
    if (SplitPeerAddress(address).relay_to.empty()) channels_.Forget(address);
  }

 private:
  rpc::ChannelCache channels_;
  PeerMetrics* const metrics_;
};

}  // namespace shoal::peer
