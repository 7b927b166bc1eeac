#include "services/coordinator/grpc_dialer.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"

namespace shoal::coordinator {

absl::Status GrpcDialer::Dial(const std::string& address, absl::Time deadline) {
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
