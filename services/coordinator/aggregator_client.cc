#include "services/coordinator/aggregator_client.h"

#include <grpcpp/client_context.h>

#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "libs/tensor/frame_codec.h"

namespace shoal::coordinator {

namespace agg = aggregator::v1;

GrpcAggregatorClient::GrpcAggregatorClient(std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           absl::Duration call_timeout,
                                           absl::Duration transfer_timeout)
    : credentials_(std::move(credentials)),
      call_timeout_(call_timeout),
      transfer_timeout_(transfer_timeout) {}

agg::AggregatorService::Stub& GrpcAggregatorClient::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (!stub) stub = agg::AggregatorService::NewStub(rpc::MakeChannel(address, credentials_));
  return *stub;
}

absl::Status GrpcAggregatorClient::OpenRound(const std::string& address,
                                             const agg::OpenRoundRequest& request) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, call_timeout_);
  agg::OpenRoundResponse response;
  return rpc::FromGrpcStatus(StubFor(address).OpenRound(&context, request, &response));
}

absl::StatusOr<agg::CloseRoundResponse> GrpcAggregatorClient::CloseRound(
    const std::string& address, const agg::CloseRoundRequest& request) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, call_timeout_);
  agg::CloseRoundResponse response;
  absl::Status s = rpc::FromGrpcStatus(StubFor(address).CloseRound(&context, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<tensor::FlatModel> GrpcAggregatorClient::GetModel(const std::string& address,
                                                                 const std::string& task,
                                                                 uint64_t version) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, transfer_timeout_);
  agg::GetModelRequest request;
  request.set_task(task);
  request.set_version(version);
  auto reader = StubFor(address).GetModel(&context, request);
  absl::StatusOr<rpc::ReceivedModel> received =
      rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &context);
  if (!received.ok()) return received.status();
  return std::move(received->model);
}

absl::Status GrpcAggregatorClient::PutModel(const std::string& address, const std::string& task,
                                            uint64_t version, const tensor::FlatModel& model) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, transfer_timeout_);
  agg::PutModelResponse response;
  auto writer = StubFor(address).PutModel(&context, &response);
  return rpc::WritePutModel(*writer, tensor::MakeModelMeta(task, version, model), model);
}

absl::Status GrpcAggregatorClient::ReleaseTask(const std::string& address,
                                               const std::string& task) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, call_timeout_);
  agg::ReleaseTaskRequest request;
  request.set_task(task);
  agg::ReleaseTaskResponse response;
  return rpc::FromGrpcStatus(StubFor(address).ReleaseTask(&context, request, &response));
}

}  // namespace shoal::coordinator
