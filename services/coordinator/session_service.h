#pragma once

#include <grpcpp/support/server_callback.h>

#include <atomic>

#include "services/coordinator/coordinator_core.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"

namespace shoal::coordinator {

// gRPC adapter for SessionService: one bidi reactor per peer stream, forwarding messages to the
// CoordinatorCore and writing the core's events back; and the timed uploads nodes measure their
// bandwidth with (counted and dropped here), and the aggregators peers measure round trips to.
// Thread-safe; the core must outlive it.
class SessionServiceImpl final : public v1::SessionService::CallbackService {
 public:
  explicit SessionServiceImpl(CoordinatorCore& core) : core_(core) {}

  grpc::ServerBidiReactor<v1::PeerMessage, v1::CoordinatorEvent>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<v1::UploadProbe>* MeasureUpload(grpc::CallbackServerContext* context,
                                                          v1::UploadProbeResult* result) override;
  grpc::ServerUnaryReactor* ListAggregators(grpc::CallbackServerContext* context,
                                            const v1::ListAggregatorsRequest* request,
                                            v1::ListAggregatorsResponse* response) override;

 private:
  CoordinatorCore& core_;
  std::atomic<int> measuring_{0};  // MeasureUpload calls running
};

}  // namespace shoal::coordinator
