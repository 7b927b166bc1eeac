#include "services/aggregator/grpc_aggregator_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "services/aggregator/masked_chunks.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"

namespace shoal::aggregator {
namespace {

// The masked values a peer writes per message (masked_chunks.h): small enough that the copy
// gRPC serializes each into is memory the allocator reuses, not fresh pages.
constexpr size_t kMaskedWriteBytes = size_t{256} << 10;

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  context.set_deadline(absl::ToChronoTime(deadline));
}

std::unique_ptr<v1::AggregatorService::Stub> Stub(rpc::ChannelCache& channels,
                                                  const std::string& address) {
  return v1::AggregatorService::NewStub(channels.Get(address));
}

absl::Status WithContext(const absl::Status& s, const std::string& what,
                         const std::string& address) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, " at aggregator ", address, ": ", s.message()));
}

}  // namespace

absl::StatusOr<uint64_t> GrpcAggregatorClient::PutModel(
    const std::string& address, const common::v1::ModelMeta& meta,
    std::shared_ptr<const tensor::EncodedModel> model, const Caller& caller, absl::Time deadline) {
  std::shared_ptr<grpc::Channel> channel = channels_.Get(address);
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::PutModelRequest first;
  *first.mutable_meta() = meta;
  first.set_peer_id(caller.peer_id);
  first.set_session_token(caller.session_token);
  const uint64_t bytes = model->payload_bytes();
  const absl::Time started = absl::Now();
  absl::StatusOr<aggregator::v1::PutModelResponse> response =
      rpc::PutModelZeroCopy(*channel, context, first, std::move(model));
  if (!response.ok()) return WithContext(response.status(), "PutModel", address);
  // The link's only measure before the first download (the peer that uploads the initial
  // model has none): an upload, a lower bound of most links' download.
  RecordRate({address, meta.task()}, bytes, absl::Now() - started, /*replace=*/false);
  return response->digest_xxh3();
}

void GrpcAggregatorClient::RecordRate(const std::pair<std::string, std::string>& link,
                                      uint64_t bytes, absl::Duration took, bool replace) {
  if (bytes == 0 || took <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&rates_mu_);
  auto at = rates_.find(link);
  if (at != rates_.end() && !replace) return;
  if (at == rates_.end() && rates_.size() >= kMaxRates) rates_.erase(rates_.begin());
  rates_[link] = static_cast<double>(bytes) / absl::ToDoubleSeconds(took);
}

absl::StatusOr<bool> GrpcAggregatorClient::PushUpdate(
    const std::string& address, const aggregator::v1::UpdateMeta& meta,
    std::shared_ptr<const tensor::EncodedModel> delta, absl::Time deadline) {
  std::shared_ptr<grpc::Channel> channel = channels_.Get(address);
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  absl::StatusOr<aggregator::v1::PushUpdateResponse> response =
      rpc::PushUpdateZeroCopy(*channel, context, meta, std::move(delta));
  if (!response.ok()) return WithContext(response.status(), "PushUpdate", address);
  return response->duplicate();
}

absl::Status GrpcAggregatorClient::SecureAggregate(const std::string& address,
                                                   const std::string& task, uint64_t round,
                                                   const Caller& caller, SecureParty& party,
                                                   absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  auto stream = Stub(channels_, address)->SecureAggregate(&context);
  v1::SecureAggregationRequest request;
  v1::SecureAggregationJoin& join = *request.mutable_join();
  join.set_task(task);
  join.set_round(round);
  join.set_peer_id(caller.peer_id);
  join.set_session_token(caller.session_token);
  absl::Status refused;
  bool done = false;
  bool open = stream->Write(request);
  v1::SecureAggregationResponse response;
  while (open && stream->Read(&response)) {
    absl::StatusOr<std::optional<v1::SecureAggregationRequest>> answer = party.Answer(response);
    if (!answer.ok()) {
      refused = answer.status();
      context.TryCancel();
      break;
    }
    if (!answer->has_value()) {
      done = true;
      stream->WritesDone();
      open = false;
      while (stream->Read(&response)) {
      }
      break;
    }
    // A masked update goes in chunks of kMaskedWriteBytes (the aggregator puts them together):
    // each chunk's serialized copy then reuses memory, where one 4 MB message would take fresh
    // pages every round. Its buffer then goes back to the party for the next round.
    v1::SecureAggregationRequest& out = **answer;
    open = WriteMaskedChunksOf(
        out, [&stream](const auto& message) { return stream->Write(message); }, kMaskedWriteBytes);
    if (out.has_masked()) party.Recycle(std::move(out));
  }
  absl::Status s = rpc::FromGrpcStatus(stream->Finish());
  if (!refused.ok()) return WithContext(refused, "SecureAggregate (this peer refused)", address);
  if (!s.ok()) return WithContext(s, "SecureAggregate", address);
  if (!done) {
    return WithContext(absl::FailedPreconditionError("the stream ended before the round was done"),
                       "SecureAggregate", address);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> GrpcAggregatorClient::PushPartial(const std::string& address,
                                                       const v1::PartialMeta& meta,
                                                       absl::string_view bytes,
                                                       absl::Time deadline) {
  constexpr size_t kChunkBytes = size_t{1} << 20;
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::PushPartialResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushPartialRequest>> writer =
      Stub(channels_, address)->PushPartial(&context, &response);
  v1::PushPartialRequest request;
  *request.mutable_meta() = meta;
  bool open = writer->Write(request);
  for (size_t at = 0; open && at < bytes.size(); at += kChunkBytes) {
    request.set_chunk(std::string(bytes.substr(at, kChunkBytes)));
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  absl::Status s = rpc::FromGrpcStatus(writer->Finish());
  if (!s.ok()) return WithContext(s, "PushPartial", address);
  return response.duplicate();
}

absl::StatusOr<tensor::ReceivedModel> GrpcAggregatorClient::Download(
    const std::string& address, const std::string& task, uint64_t version, const Caller& caller,
    absl::Time deadline, tensor::WriteValues write, const HeldModel* held,
    std::vector<float> buffer) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  aggregator::v1::GetModelRequest request;
  request.set_task(task);
  request.set_version(version);
  request.set_peer_id(caller.peer_id);
  request.set_session_token(caller.session_token);
  if (held != nullptr) request.set_base_version(held->version);
  const std::pair<std::string, std::string> link(address, task);
  {
    absl::MutexLock lock(&rates_mu_);
    if (auto rate = rates_.find(link); rate != rates_.end()) {
      request.set_download_bytes_per_second(rate->second);
    }
  }
  // Read raw: chunks are decoded straight from the received slices.
  auto reader = rpc::OpenRawReader(
      *channels_.Get(address), "/shoal.aggregator.v1.AggregatorService/GetModel", context, request);
  absl::Time first_message = absl::InfiniteFuture();  // after any wait for an encoding
  auto make_decoder =
      [&](const common::v1::ModelMeta& meta) -> absl::StatusOr<tensor::FrameDecoder> {
    first_message = absl::Now();
    tensor::ReadValues base;
    if (meta.has_xor_base_version()) {
      if (held == nullptr || meta.xor_base_version() != held->version) {
        return absl::InvalidArgumentError(
            absl::StrCat("the model comes encoded against version ", meta.xor_base_version(),
                         held == nullptr ? ", but none was named" : ", not the one held"));
      }
      base = held->read;
    }
    return tensor::FrameDecoder::ForMeta(meta, tensor::DecoderLimits{}, /*require_finite=*/false,
                                         write, std::move(base), std::move(buffer));
  };
  absl::StatusOr<tensor::ReceivedModel> received =
      rpc::ReadModelStreamWith(*reader, make_decoder, &context);
  if (!received.ok()) return WithContext(received.status(), "GetModel", address);
  if (received->meta.task() != task || received->meta.version() != version) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetModel at aggregator ", address, ": asked for ", task, " version ", version,
                     ", got ", received->meta.task(), " version ", received->meta.version()));
  }
  RecordRate(link, received->payload_bytes, absl::Now() - first_message, /*replace=*/true);
  return received;
}

absl::StatusOr<tensor::FlatModel> GrpcAggregatorClient::GetModel(
    const std::string& address, const std::string& task, uint64_t version, const Caller& caller,
    absl::Time deadline, std::vector<float> buffer) {
  absl::StatusOr<tensor::ReceivedModel> received =
      Download(address, task, version, caller, deadline, nullptr, nullptr, std::move(buffer));
  if (!received.ok()) return received.status();
  return std::move(received->model);
}

absl::StatusOr<AggregatorClient::ModelDownload> GrpcAggregatorClient::GetModelInto(
    const std::string& address, const std::string& task, uint64_t version, const Caller& caller,
    absl::Time deadline, const tensor::WriteValues& write, const HeldModel* held) {
  absl::StatusOr<tensor::ReceivedModel> received =
      Download(address, task, version, caller, deadline, write, held);
  if (!received.ok()) return received.status();
  return ModelDownload{std::move(received->model.layout), received->payload_bytes};
}

absl::Status GrpcAggregatorClient::OpenRound(const std::string& address,
                                             const v1::OpenRoundRequest& request,
                                             absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::OpenRoundResponse response;
  return WithContext(
      rpc::FromGrpcStatus(Stub(channels_, address)->OpenRound(&context, request, &response)),
      "OpenRound", address);
}

absl::StatusOr<v1::CloseRoundResponse> GrpcAggregatorClient::CloseRound(
    const std::string& address, const v1::CloseRoundRequest& request, absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::CloseRoundResponse response;
  absl::Status s =
      rpc::FromGrpcStatus(Stub(channels_, address)->CloseRound(&context, request, &response));
  if (!s.ok()) return WithContext(s, "CloseRound", address);
  return response;
}

absl::Status GrpcAggregatorClient::OpenBuffer(const std::string& address,
                                              const v1::OpenBufferRequest& request,
                                              absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::OpenBufferResponse response;
  return WithContext(
      rpc::FromGrpcStatus(Stub(channels_, address)->OpenBuffer(&context, request, &response)),
      "OpenBuffer", address);
}

absl::Status GrpcAggregatorClient::SetMembers(const std::string& address,
                                              const v1::SetMembersRequest& request,
                                              absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::SetMembersResponse response;
  return WithContext(
      rpc::FromGrpcStatus(Stub(channels_, address)->SetMembers(&context, request, &response)),
      "SetMembers", address);
}

absl::StatusOr<std::optional<uint64_t>> GrpcAggregatorClient::ReleaseTask(
    const std::string& address, const std::string& task, absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::ReleaseTaskRequest request;
  request.set_task(task);
  v1::ReleaseTaskResponse response;
  SHOAL_RETURN_IF_ERROR(WithContext(
      rpc::FromGrpcStatus(Stub(channels_, address)->ReleaseTask(&context, request, &response)),
      "ReleaseTask", address));
  if (!response.has_newest_version()) return std::nullopt;
  return response.newest_version();
}

absl::StatusOr<bool> GrpcAggregatorClient::PullModel(const std::string& address,
                                                     const v1::PullModelRequest& request,
                                                     absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::PullModelResponse response;
  absl::Status s =
      rpc::FromGrpcStatus(Stub(channels_, address)->PullModel(&context, request, &response));
  if (!s.ok()) return WithContext(s, "PullModel", address);
  return response.fetched();
}

namespace {

// The client end of one WatchTask stream. Not self-deleting: its GrpcWatch owner cancels it and
// waits for OnDone before destroying it.
class WatchReactor final : public grpc::ClientReadReactor<v1::TaskEvent> {
 public:
  WatchReactor(v1::AggregatorService::Stub& stub, const std::string& task,
               AggregatorClient::TaskEventFn on_event, AggregatorClient::WatchDoneFn on_done,
               std::string address)
      : on_event_(std::move(on_event)), on_done_(std::move(on_done)), address_(std::move(address)) {
    request_.set_task(task);
    stub.async()->WatchTask(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    on_event_(event_);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    on_done_(WithContext(rpc::FromGrpcStatus(status), "WatchTask", address_));
    // The owner may delete this reactor as soon as it is notified: touch only the local copy.
    std::shared_ptr<absl::Notification> done = done_;
    done->Notify();
  }

  void Cancel() { context_.TryCancel(); }
  void WaitDone() { done_->WaitForNotification(); }

 private:
  grpc::ClientContext context_;
  v1::WatchTaskRequest request_;
  v1::TaskEvent event_;
  const AggregatorClient::TaskEventFn on_event_;
  const AggregatorClient::WatchDoneFn on_done_;
  const std::string address_;
  const std::shared_ptr<absl::Notification> done_ = std::make_shared<absl::Notification>();
};

class GrpcWatch final : public AggregatorWatch {
 public:
  GrpcWatch(std::unique_ptr<v1::AggregatorService::Stub> stub, const std::string& task,
            AggregatorClient::TaskEventFn on_event, AggregatorClient::WatchDoneFn on_done,
            const std::string& address)
      : stub_(std::move(stub)),
        reactor_(std::make_unique<WatchReactor>(*stub_, task, std::move(on_event),
                                                std::move(on_done), address)) {}
  ~GrpcWatch() override {
    reactor_->Cancel();
    reactor_->WaitDone();
  }

 private:
  std::unique_ptr<v1::AggregatorService::Stub> stub_;
  std::unique_ptr<WatchReactor> reactor_;
};

}  // namespace

std::unique_ptr<AggregatorWatch> GrpcAggregatorClient::WatchTask(const std::string& address,
                                                                 const std::string& task,
                                                                 TaskEventFn on_event,
                                                                 WatchDoneFn on_done) {
  return std::make_unique<GrpcWatch>(Stub(channels_, address), task, std::move(on_event),
                                     std::move(on_done), address);
}

}  // namespace shoal::aggregator
