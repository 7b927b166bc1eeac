#include "services/coordinator/grpc_dialer.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::coordinator {

absl::Status GrpcDialer::Dial(const std::string& address, absl::Time deadline) {
  const rpc::PeerAddress target = rpc::SplitPeerAddress(address);
  if (!target.relay_to.empty()) {
    // A peer behind NAT: reachable when it answers a probe through its relay.
    auto stub = peer::v1::PeerService::NewStub(rpc::MakeChannel(target.dial, credentials_));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    peer::v1::ProbeRequest request;
    request.set_relay_to(target.relay_to);
    request.set_peer_id("coordinator");
    peer::v1::ProbeResponse response;
    grpc::Status status = stub->Probe(&context, request, &response);
    if (!status.ok()) {
      absl::Status s = rpc::FromGrpcStatus(status);
      return absl::Status(s.code(),
                          absl::StrCat("probing ", address, " through its relay: ", s.message()));
    }
    return absl::OkStatus();
  }
  auto stub = grpc::health::v1::Health::NewStub(rpc::MakeChannel(address, credentials_));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    absl::Status s = rpc::FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat("dialing ", address, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
