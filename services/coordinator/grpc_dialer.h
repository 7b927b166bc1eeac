#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "services/coordinator/dialer.h"

namespace shoal::coordinator {

// Dials with the coordinator's client credentials and asks the standard health service
// (grpc.health.v1.Health/Check, whole server), which every Shoal server runs. A fresh channel
// per dial: each node is dialed once per session. A peer behind NAT (HOST:PORT/PEER_ID) is
// probed through its relay (PeerService.Probe with relay_to).
class GrpcDialer final : public Dialer {
 public:
  explicit GrpcDialer(std::shared_ptr<grpc::ChannelCredentials> credentials)
      : credentials_(std::move(credentials)) {}
  absl::Status Dial(const std::string& address, absl::Time deadline) override;

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

}  // namespace shoal::coordinator
