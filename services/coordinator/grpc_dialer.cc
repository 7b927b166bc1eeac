#include "services/coordinator/grpc_dialer.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/common/address.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::coordinator {

absl::Status GrpcDialer::Dial(const std::string& address, absl::Time deadline) {
  const PeerAddress target = SplitPeerAddress(address);
  if (!target.relay_to.empty()) {
    // A peer behind NAT: reachable when it answers a probe through its relay. It opens its
    // relay stream when it is welcomed, so a relay that does not know it yet (NOT_FOUND) is
    // asked again until the deadline.
    auto stub = peer::v1::PeerService::NewStub(rpc::MakeProbeChannel(target.dial, credentials_));
    peer::v1::ProbeRequest request;
    request.set_relay_to(target.relay_to);
    request.set_peer_id("coordinator");
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      peer::v1::ProbeResponse response;
      const grpc::Status status = stub->Probe(&context, request, &response);
      if (status.ok()) return absl::OkStatus();
      if (status.error_code() != grpc::StatusCode::NOT_FOUND ||
          absl::Now() + absl::Milliseconds(100) >= deadline) {
        absl::Status s = rpc::FromGrpcStatus(status);
        return absl::Status(s.code(),
                            absl::StrCat("probing ", address, " through its relay: ", s.message()));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  auto stub = grpc::health::v1::Health::NewStub(rpc::MakeProbeChannel(address, credentials_));
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
