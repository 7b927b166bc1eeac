#include "services/aggregator/aggregator_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"

namespace shoal::aggregator {
namespace {

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  context.set_deadline(absl::ToChronoTime(deadline));
}

absl::Status WithContext(const absl::Status& s, const std::string& what,
                         const std::string& address) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, " at aggregator ", address, ": ", s.message()));
}

}  // namespace

struct GrpcAggregatorClient::Stub {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<aggregator::v1::AggregatorService::Stub> stub;
};

std::shared_ptr<GrpcAggregatorClient::Stub> GrpcAggregatorClient::StubFor(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& slot = stubs_[address];
  if (!slot) {
    slot = std::make_shared<Stub>();
    slot->channel = credentials_ != nullptr ? rpc::MakeChannel(address, credentials_)
                                            : rpc::MakeChannel(address);
    slot->stub = aggregator::v1::AggregatorService::NewStub(slot->channel);
  }
  return slot;
}

absl::StatusOr<uint64_t> GrpcAggregatorClient::PutModel(
    const std::string& address, const common::v1::ModelMeta& meta,
    std::shared_ptr<const tensor::FlatModel> model, const Caller& caller, absl::Time deadline) {
  std::shared_ptr<Stub> stub = StubFor(address);
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::PutModelRequest first;
  *first.mutable_meta() = meta;
  first.set_peer_id(caller.peer_id);
  first.set_session_token(caller.session_token);
  absl::StatusOr<aggregator::v1::PutModelResponse> response =
      rpc::PutModelZeroCopy(*stub->channel, context, first, std::move(model));
  if (!response.ok()) return WithContext(response.status(), "PutModel", address);
  return response->digest_xxh3();
}

absl::StatusOr<bool> GrpcAggregatorClient::PushUpdate(
    const std::string& address, const aggregator::v1::UpdateMeta& meta,
    std::shared_ptr<const tensor::FlatModel> delta, absl::Time deadline) {
  std::shared_ptr<Stub> stub = StubFor(address);
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  absl::StatusOr<aggregator::v1::PushUpdateResponse> response =
      rpc::PushUpdateZeroCopy(*stub->channel, context, meta, std::move(delta));
  if (!response.ok()) return WithContext(response.status(), "PushUpdate", address);
  return response->duplicate();
}

absl::StatusOr<tensor::FlatModel> GrpcAggregatorClient::GetModel(const std::string& address,
                                                                 const std::string& task,
                                                                 uint64_t version,
                                                                 const Caller& caller,
                                                                 absl::Time deadline) {
  std::shared_ptr<Stub> stub = StubFor(address);
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  aggregator::v1::GetModelRequest request;
  request.set_task(task);
  request.set_version(version);
  request.set_peer_id(caller.peer_id);
  request.set_session_token(caller.session_token);
  auto reader = stub->stub->GetModel(&context, request);
  absl::StatusOr<rpc::ReceivedModel> received =
      rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &context);
  if (!received.ok()) return WithContext(received.status(), "GetModel", address);
  if (received->meta.task() != task || received->meta.version() != version) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetModel at aggregator ", address, ": asked for ", task, " version ", version,
                     ", got ", received->meta.task(), " version ", received->meta.version()));
  }
  return std::move(received->model);
}

absl::Status GrpcAggregatorClient::OpenRound(const std::string& address,
                                             const v1::OpenRoundRequest& request,
                                             absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::OpenRoundResponse response;
  return WithContext(
      rpc::FromGrpcStatus(StubFor(address)->stub->OpenRound(&context, request, &response)),
      "OpenRound", address);
}

absl::StatusOr<v1::CloseRoundResponse> GrpcAggregatorClient::CloseRound(
    const std::string& address, const v1::CloseRoundRequest& request, absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::CloseRoundResponse response;
  absl::Status s =
      rpc::FromGrpcStatus(StubFor(address)->stub->CloseRound(&context, request, &response));
  if (!s.ok()) return WithContext(s, "CloseRound", address);
  return response;
}

absl::Status GrpcAggregatorClient::SetMembers(const std::string& address,
                                              const v1::SetMembersRequest& request,
                                              absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::SetMembersResponse response;
  return WithContext(
      rpc::FromGrpcStatus(StubFor(address)->stub->SetMembers(&context, request, &response)),
      "SetMembers", address);
}

absl::Status GrpcAggregatorClient::ReleaseTask(const std::string& address, const std::string& task,
                                               absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::ReleaseTaskRequest request;
  request.set_task(task);
  v1::ReleaseTaskResponse response;
  return WithContext(
      rpc::FromGrpcStatus(StubFor(address)->stub->ReleaseTask(&context, request, &response)),
      "ReleaseTask", address);
}

}  // namespace shoal::aggregator
