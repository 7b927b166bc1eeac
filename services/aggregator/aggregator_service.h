#pragma once

#include "libs/common/executor.h"
#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/download_deltas.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"

namespace shoal::aggregator {

struct AggregatorServiceOptions {
  tensor::DecoderLimits limits;  // for PutModel streams
};

// gRPC adapter of AggregatorService over AggregatorCore. Handlers are thin: streams are
// validated frame by frame inside their reactions (cheap: a copy and a digest update per
// chunk); completing an upload, folding an update (or aggregating a full federated-async
// buffer) and closing a round run on `executor`; what waits on a tree node's parent (fetching a
// version from it, sending a child round's partial sum up at CloseRound) runs on `transfers`, so
// a slow or unreachable parent never holds up the folds and answers of the peers' pushes. Either
// answers RESOURCE_EXHAUSTED when it is full. Owned by the server; core, the executors and
// metrics must outlive it. Thread-safe.
// PushUpdate is registered raw (ByteBuffer in, ByteBuffer out) so chunk bytes are copied once,
// straight from the received slices into the staging buffer, instead of being parsed into a
// protobuf string first. GetModel is raw too: chunks go out as slices of the model's own memory
// (rpc::ModelWriteReactor), never copied into protobuf messages; one asked for against a version
// still held (base_version) goes out XOR_SPARSE_ZLIB-encoded when `downloads` has that encoding
// ready (DownloadDeltas, which makes it on its own encoder), raw otherwise.
class AggregatorServiceImpl final
    : public aggregator::v1::AggregatorService::WithRawCallbackMethod_GetModel<
          aggregator::v1::AggregatorService::WithRawCallbackMethod_PushUpdate<
              aggregator::v1::AggregatorService::CallbackService>> {
 public:
  // `parents`: the client a child round fetches its base version with (and a primary copies
  // updates to its backups with); `parent_link`: what a child round's CloseRound sends its
  // partial sum with; `downloads`: the encodings of downloads against a held version (it must
  // outlive this).
  AggregatorServiceImpl(AggregatorServiceOptions options, AggregatorCore& core, Executor& executor,
                        Executor& transfers, AggregatorMetrics& metrics, AggregatorClient& parents,
                        ParentLink& parent_link, DownloadDeltas& downloads);

  grpc::ServerReadReactor<aggregator::v1::PutModelRequest>* PutModel(
      grpc::CallbackServerContext* context, aggregator::v1::PutModelResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushUpdate(grpc::CallbackServerContext* context,
                                                        grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetModel(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  // aggregator_service_partials.cc
  grpc::ServerReadReactor<aggregator::v1::PushPartialRequest>* PushPartial(
      grpc::CallbackServerContext* context, aggregator::v1::PushPartialResponse* response) override;
  grpc::ServerUnaryReactor* PullModel(grpc::CallbackServerContext* context,
                                      const aggregator::v1::PullModelRequest* request,
                                      aggregator::v1::PullModelResponse* response) override;
  // aggregator_service.cc
  grpc::ServerUnaryReactor* OpenRound(grpc::CallbackServerContext* context,
                                      const aggregator::v1::OpenRoundRequest* request,
                                      aggregator::v1::OpenRoundResponse* response) override;
  grpc::ServerUnaryReactor* OpenBuffer(grpc::CallbackServerContext* context,
                                       const aggregator::v1::OpenBufferRequest* request,
                                       aggregator::v1::OpenBufferResponse* response) override;
  grpc::ServerUnaryReactor* CloseRound(grpc::CallbackServerContext* context,
                                       const aggregator::v1::CloseRoundRequest* request,
                                       aggregator::v1::CloseRoundResponse* response) override;
  grpc::ServerWriteReactor<v1::TaskEvent>* WatchTask(grpc::CallbackServerContext* context,
                                                     const v1::WatchTaskRequest* request) override;
  grpc::ServerUnaryReactor* ReleaseTask(grpc::CallbackServerContext* context,
                                        const aggregator::v1::ReleaseTaskRequest* request,
                                        aggregator::v1::ReleaseTaskResponse* response) override;
  grpc::ServerUnaryReactor* SetMembers(grpc::CallbackServerContext* context,
                                       const aggregator::v1::SetMembersRequest* request,
                                       aggregator::v1::SetMembersResponse* response) override;
  // aggregator_service_secure.cc
  grpc::ServerBidiReactor<aggregator::v1::SecureAggregationRequest,
                          aggregator::v1::SecureAggregationResponse>*
  SecureAggregate(grpc::CallbackServerContext* context) override;

 private:
  // CloseRound of a child's round: closes it into its partial sum and sends that to `parent`
  // (aggregator_service_partials.cc).
  absl::StatusOr<v1::CloseRoundResponse> CloseChildRound(const std::string& task, uint64_t round,
                                                         const v1::ParentRound& parent,
                                                         absl::Time deadline);
  // Stores `version` of `task`, fetched from `parent` (a child round's base version, or the
  // version the root published: PullModel); errors start with `what` and the version.
  absl::Status FetchFromParent(const std::string& task, uint64_t version,
                               const v1::ParentRound& parent, const std::string& what,
                               absl::Time deadline);

  const AggregatorServiceOptions options_;
  AggregatorCore& core_;
  Executor& executor_;   // folds, uploads, a round's close
  Executor& transfers_;  // waits on the parent
  AggregatorMetrics& metrics_;
  AggregatorClient& parents_;
  ParentLink& parent_link_;
  DownloadDeltas& downloads_;  // GetModel against a held version
};

}  // namespace shoal::aggregator
