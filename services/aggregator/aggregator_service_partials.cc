// AggregatorService's tree rounds: PushPartial (a child's partial sum into this aggregator's
// round) and the child side of CloseRound (the round's partial sum sent to its parent).

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "services/aggregator/aggregator_service.h"
#include "services/aggregator/call_checks.h"
#include "services/aggregator/partial_wire.h"

namespace shoal::aggregator {
namespace {

using aggregator::v1::PushPartialRequest;

// Receives one child's partial sum: the meta (caller, round and size checked before anything
// is allocated, one staging slot held), then its bytes copied into the sum; adding it (a pass
// over the model) runs on the executor.
class PushPartialReactor final : public grpc::ServerReadReactor<PushPartialRequest> {
 public:
  PushPartialReactor(AggregatorCore& core, Executor& executor, AggregatorMetrics& metrics,
                     v1::PushPartialResponse* response, std::string caller_identity)
      : core_(core),
        executor_(executor),
        metrics_(metrics),
        response_(response),
        caller_identity_(std::move(caller_identity)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      EndOfStream();
      return;
    }
    metrics_.bytes_received.Increment(static_cast<double>(request_.ByteSizeLong()));
    if (absl::Status s = Handle(); !s.ok()) {
      Finish(rpc::ToGrpcStatus(s));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    if (!receiver_.has_value()) {
      if (request_.item_case() != PushPartialRequest::kMeta) {
        return absl::InvalidArgumentError("PushPartial stream must start with a PartialMeta");
      }
      const v1::PartialMeta& meta = request_.meta();
      if (absl::Status s = core_.CheckChildCaller(meta.task(), meta.child(), caller_identity_);
          !s.ok()) {
        return s;
      }
      absl::StatusOr<size_t> values = core_.PartialValues(meta.task(), meta.round());
      if (!values.ok()) return values.status();
      auto lease = core_.AcquireStaging();
      if (!lease.ok()) return lease.status();
      lease_.emplace(*std::move(lease));
      auto receiver = PartialReceiver::Start(meta, *values);
      if (!receiver.ok()) return receiver.status();
      receiver_.emplace(*std::move(receiver));
      return absl::OkStatus();
    }
    if (request_.item_case() != PushPartialRequest::kChunk) {
      return absl::InvalidArgumentError("PushPartial stream carries a second PartialMeta");
    }
    return receiver_->Add(request_.chunk());
  }

  void EndOfStream() {
    if (!receiver_.has_value()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "PushPartial stream ended before its PartialMeta"));
      return;
    }
    if (!executor_.TrySubmit([this] { Complete(); })) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "aggregator is busy (work queue full); retry later"));
    }
  }

  void Complete() {
    absl::StatusOr<PartialResult> partial = std::move(*receiver_).Finish();
    receiver_.reset();
    absl::Status status = partial.status();
    if (partial.ok()) {
      absl::StatusOr<bool> added = core_.AddPartial(partial->meta, partial->sum);
      status = added.status();
      if (added.ok()) response_->set_duplicate(*added);
    }
    partial = absl::CancelledError();  // frees the sum before the slot
    lease_.reset();
    Finish(rpc::ToGrpcStatus(status));
  }

  AggregatorCore& core_;
  Executor& executor_;
  AggregatorMetrics& metrics_;
  v1::PushPartialResponse* response_;
  const std::string caller_identity_;  // the caller's certificate name; "" when plaintext
  PushPartialRequest request_;
  std::optional<AggregatorCore::StagingLease> lease_;
  std::optional<PartialReceiver> receiver_;
};

}  // namespace

grpc::ServerReadReactor<PushPartialRequest>* AggregatorServiceImpl::PushPartial(
    grpc::CallbackServerContext* context, v1::PushPartialResponse* response) {
  return new PushPartialReactor(core_, executor_, metrics_, response,
                                rpc::CallerIdentity(*context));
}

absl::StatusOr<v1::CloseRoundResponse> AggregatorServiceImpl::CloseChildRound(
    const std::string& task, uint64_t round, const v1::ParentRound& parent, absl::Time deadline) {
  absl::StatusOr<std::shared_ptr<const PartialResult>> partial = core_.ClosePartial(task, round);
  if (!partial.ok()) return partial.status();
  const PartialResult& p = **partial;
  if (absl::Status sent = parent_link_.Send(parent, p, deadline); !sent.ok()) {
    // The round stays closed with its sum: the coordinator's retry of CloseRound sends it again.
    return absl::Status(sent.code(),
                        absl::StrCat("round ", round, " of task '", task,
                                     "': sending its partial sum to the parent: ", sent.message()));
  }
  metrics_.partials_forwarded.Increment();
  v1::CloseRoundResponse response;
  response.set_version(p.meta.base_version);
  for (const std::string& c : p.meta.contributors) response.add_contributors(c);
  response.set_num_samples(p.meta.num_samples);
  response.set_mean_train_loss(
      p.meta.num_samples > 0 ? p.meta.loss_sum / static_cast<double>(p.meta.num_samples) : 0);
  if (absl::StatusOr<ModelSnapshot> base = core_.GetModel(task, p.meta.base_version); base.ok()) {
    response.set_digest_xxh3(base->model->Digest());
    response.set_model_bytes(base->model->layout.total_bytes());
  }
  response.set_forwarded(true);
  return response;
}

absl::Status AggregatorServiceImpl::FetchFromParent(const std::string& task, uint64_t version,
                                                    const v1::ParentRound& parent,
                                                    const std::string& what, absl::Time deadline) {
  absl::StatusOr<tensor::FlatModel> model = parents_.GetModel(
      parent.address(), task, version, Caller{parent.child(), ""}, deadline, core_.TakeBuffer());
  if (!model.ok()) {
    return absl::Status(
        model.status().code(),
        absl::StrCat(what, " ", version, " from the parent: ", model.status().message()));
  }
  metrics_.bytes_received.Increment(static_cast<double>(model->layout.total_bytes()));
  return core_.PutModel(task, version, *std::move(model)).status();
}

grpc::ServerUnaryReactor* AggregatorServiceImpl::PullModel(grpc::CallbackServerContext* context,
                                                           const v1::PullModelRequest* request,
                                                           v1::PullModelResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCoordinator(*context); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  const v1::ParentRound& parent = request->parent();
  if (request->task().empty() || parent.address().empty() || parent.child().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "PullModel needs a task, and the parent's address and this "
                                 "aggregator's id there"));
    return reactor;
  }
  if (core_.GetModel(request->task(), request->version()).ok()) {
    reactor->Finish(grpc::Status::OK);  // held already: fetched stays false
    return reactor;
  }
  // A transfer, on the transfer pool, within the call's deadline.
  const absl::Time deadline = CallDeadline(*context);
  if (!transfers_.TrySubmit([this, reactor, request, response, deadline] {
        absl::Status s = FetchFromParent(
            request->task(), request->version(), request->parent(),
            absl::StrCat("task '", request->task(), "': fetching version"), deadline);
        response->set_fetched(s.ok());
        reactor->Finish(rpc::ToGrpcStatus(s));
      })) {
    reactor->Finish(Busy());
  }
  return reactor;
}

}  // namespace shoal::aggregator
