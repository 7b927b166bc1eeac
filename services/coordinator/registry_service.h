#pragma once

#include "services/coordinator/coordinator_core.h"
#include "shoal/coordinator/v1/registry.grpc.pb.h"

namespace shoal::coordinator {

// gRPC adapter for RegistryService. Thread-safe; the core must outlive it.
class RegistryServiceImpl final : public v1::RegistryService::CallbackService {
 public:
  explicit RegistryServiceImpl(CoordinatorCore& core) : core_(core) {}

  grpc::ServerUnaryReactor* RegisterAggregator(grpc::CallbackServerContext* context,
                                               const v1::RegisterAggregatorRequest* request,
                                               v1::RegisterAggregatorResponse* response) override;

 private:
  CoordinatorCore& core_;
};

}  // namespace shoal::coordinator
