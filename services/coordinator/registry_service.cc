#include "services/coordinator/registry_service.h"

#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"

namespace shoal::coordinator {

grpc::ServerUnaryReactor* RegistryServiceImpl::RegisterAggregator(
    grpc::CallbackServerContext* context, const v1::RegisterAggregatorRequest* request,
    v1::RegisterAggregatorResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status s = core_.RegisterAggregator(request->address(), request->capacity(),
                                            rpc::CallerIdentity(*context), request->host_peer());
  if (s.ok()) {
    response->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(core_.heartbeat_interval())));
    for (std::string& task : core_.TasksToRelease(
             request->address(), {request->tasks().begin(), request->tasks().end()})) {
      response->add_release(std::move(task));
    }
  }
  reactor->Finish(rpc::ToGrpcStatus(s));
  return reactor;
}

}  // namespace shoal::coordinator
