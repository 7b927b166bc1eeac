#include "services/aggregator/aggregator_service.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/reactor_handle.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "services/aggregator/call_checks.h"
#include "services/aggregator/replicas.h"

namespace shoal::aggregator {
namespace {

using aggregator::v1::PushUpdateRequest;
using aggregator::v1::PushUpdateResponse;
using aggregator::v1::PutModelRequest;

// A push that waits longer than this for a fold thread after its last byte is logged.
constexpr absl::Duration kLongWaitForFold = absl::Seconds(5);

// Receives a whole model (PutModel): meta, then frames decoded and verified as they arrive;
// storing it (digest pass) runs on the executor.
class PutModelReactor : public grpc::ServerReadReactor<PutModelRequest> {
 public:
  PutModelReactor(const AggregatorServiceOptions& options, AggregatorCore& core, Executor& executor,
                  AggregatorMetrics& metrics, aggregator::v1::PutModelResponse* response,
                  std::string caller_identity)
      : options_(options),
        core_(core),
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
    absl::Status s = Handle();
    if (!s.ok()) {
      Finish(rpc::ToGrpcStatus(s));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    if (!decoder_.has_value()) {
      if (request_.item_case() != PutModelRequest::kMeta) {
        return absl::InvalidArgumentError("PutModel stream must start with a ModelMeta");
      }
      meta_ = request_.meta();
      if (meta_.task().empty()) return absl::InvalidArgumentError("ModelMeta.task is empty");
      if (absl::Status s = core_.CheckCaller(meta_.task(), request_.peer_id(),
                                             request_.session_token(), caller_identity_);
          !s.ok()) {
        metrics_.RejectedCounter(RejectReason::kUnauthenticated).Increment();
        return s;
      }
      auto lease = core_.AcquireStaging();
      if (!lease.ok()) return lease.status();
      lease_.emplace(*std::move(lease));
      // Into storage kept for the pushes where there is some (a released staging buffer, an
      // evicted version): a fresh model-sized buffer costs the first touch of each of its pages.
      auto decoder = tensor::FrameDecoder::ForMeta(meta_, options_.limits, /*require_finite=*/true,
                                                   nullptr, nullptr, core_.TakeBuffer());
      if (!decoder.ok()) return decoder.status();
      decoder_.emplace(*std::move(decoder));
      return absl::OkStatus();
    }
    if (request_.item_case() != PutModelRequest::kFrame) {
      return absl::InvalidArgumentError("PutModel stream carries a second ModelMeta");
    }
    return decoder_->Add(request_.frame());
  }

  void EndOfStream() {
    if (!decoder_.has_value()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "PutModel stream ended before its ModelMeta"));
      return;
    }
    if (!executor_.TrySubmit([this] { Complete(); })) Finish(Busy());
  }

  void Complete() {
    auto model = std::move(*decoder_).Finish();
    decoder_.reset();
    absl::Status status = model.status();
    if (model.ok()) {
      auto put = core_.PutModel(meta_.task(), meta_.version(), *std::move(model));
      status = put.status();
      if (put.ok()) {
        response_->set_version(put->version);
        response_->set_digest_xxh3(put->digest);
      }
    }
    lease_.reset();
    Finish(rpc::ToGrpcStatus(status));
  }

  const AggregatorServiceOptions& options_;
  AggregatorCore& core_;
  Executor& executor_;
  AggregatorMetrics& metrics_;
  aggregator::v1::PutModelResponse* response_;
  const std::string caller_identity_;  // the caller's certificate name; "" when plaintext
  PutModelRequest request_;
  common::v1::ModelMeta meta_;
  std::optional<AggregatorCore::StagingLease> lease_;
  std::optional<tensor::FrameDecoder> decoder_;
};

// Receives one peer's update (PushUpdate, raw): meta, then frames validated as they arrive into
// a staging buffer; chunk messages are read straight from the received slices. Once the stream
// is complete the update is accepted on the executor, the call is answered, and then the same
// executor task folds it into the round's sum. The first bad frame ends the call with
// INVALID_ARGUMENT.
class PushUpdateReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushUpdateReactor(AggregatorCore& core, Executor& executor, AggregatorMetrics& metrics,
                    AggregatorClient& others, grpc::ByteBuffer* response,
                    std::string caller_identity)
      : core_(core),
        executor_(executor),
        metrics_(metrics),
        others_(others),
        response_(response),
        caller_identity_(std::move(caller_identity)) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      EndOfStream();
      return;
    }
    metrics_.bytes_received.Increment(static_cast<double>(message_.Length()));
    absl::Status s = Handle();
    if (finished_) return;
    if (!s.ok()) {
      Finish(rpc::ToGrpcStatus(s));
      return;
    }
    message_.Clear();
    StartRead(&message_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Parse(PushUpdateRequest* request) {
    grpc::Status s =
        grpc::GenericDeserialize<grpc::ProtoBufferReader, PushUpdateRequest>(&message_, request);
    if (!s.ok()) return absl::InvalidArgumentError("cannot parse PushUpdateRequest");
    return absl::OkStatus();
  }

  absl::Status Handle() {
    if (push_ == nullptr) {
      PushUpdateRequest request;
      absl::Status s = Parse(&request);
      if (s.ok() && request.item_case() != PushUpdateRequest::kMeta) {
        s = absl::InvalidArgumentError("PushUpdate stream must start with an UpdateMeta");
      }
      if (!s.ok()) {
        metrics_.RejectedCounter(RejectReason::kMalformed).Increment();
        return s;
      }
      const auto& m = request.meta();
      auto push = core_.BeginPush(PushMeta::From(m, caller_identity_));
      if (!push.ok()) return push.status();
      if (*push == nullptr) {
        PushUpdateResponse response;
        response.set_duplicate(true);
        FinishWith(response);
        return absl::OkStatus();
      }
      push_ = *std::move(push);
      label_ = absl::StrCat("task ", QuoteBytes(m.task()), " round ", m.round(), ": the push of ",
                            QuoteBytes(m.peer_id()));
      return absl::OkStatus();
    }
    absl::Status s;
    if (rpc::ParseChunkMessage(message_, &slices_, &parts_)) {
      s = push_->AddChunkParts(parts_);
      slices_.clear();
      parts_.clear();
    } else {
      PushUpdateRequest request;
      s = Parse(&request);
      if (s.ok()) {
        s = request.item_case() == PushUpdateRequest::kFrame
                ? push_->AddFrame(request.frame())
                : absl::InvalidArgumentError("PushUpdate stream carries a second UpdateMeta");
      }
    }
    if (!s.ok()) {
      push_->Reject(RejectReason::kMalformed);  // no-op when the push already counted it
      push_.reset();
    }
    return s;
  }

  void FinishWith(const PushUpdateResponse& response) {
    bool own = false;
    grpc::GenericSerialize<grpc::ProtoBufferWriter, PushUpdateResponse>(response, response_, &own);
    finished_ = true;
    Finish(grpc::Status::OK);
  }

  void EndOfStream() {
    if (push_ == nullptr) {
      metrics_.RejectedCounter(RejectReason::kIncomplete).Increment();
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "PushUpdate stream ended before its UpdateMeta"));
      return;
    }
    const absl::Time queued = absl::Now();
    if (!executor_.TrySubmit([this, queued] {
          // A push the peer waits for while every fold thread is busy: worth a line in the log
          // (the peer's attempt may run out meanwhile).
          if (const absl::Duration waited = absl::Now() - queued; waited > kLongWaitForFold) {
            LogWarning(label_, " waited ", absl::FormatDuration(waited),
                       " for a fold thread after its last byte");
          }
          // The push leaves the reactor: once the call is finished, OnDone may delete `this`.
          std::unique_ptr<AggregatorCore::Push> push = std::move(push_);
          absl::Status s = push->Accept();
          if (!s.ok()) {
            // Gone before the answer: a peer that retries at once is not refused as "already
            // in progress".
            push.reset();
            Finish(rpc::ToGrpcStatus(s));
            return;
          }
          // Counted in the round: its backups get it before the peer is answered, so a backup
          // promoted after this primary dies holds every update a peer was told is in.
          CopyToBackups(push->TakeReplica(), others_, metrics_);
          PushUpdateResponse response;
          response.set_duplicate(push->duplicate());
          FinishWith(response);
          // Accepted means counted in the round (CloseRound waits for this fold) or in the
          // buffer, so the peer is answered first and the pass over the model (a round's fold,
          // or a full buffer's aggregation) runs off its critical path.
          push->Fold();
        })) {
      push_->Reject(RejectReason::kBusy);
      push_.reset();
      Finish(Busy());
    }
  }

  AggregatorCore& core_;
  Executor& executor_;
  AggregatorMetrics& metrics_;
  AggregatorClient& others_;  // copies accepted updates to backups
  grpc::ByteBuffer* response_;
  const std::string caller_identity_;  // the caller's certificate name; "" when plaintext
  grpc::ByteBuffer message_;
  std::vector<grpc::Slice> slices_;
  std::vector<absl::string_view> parts_;
  bool finished_ = false;
  std::unique_ptr<AggregatorCore::Push> push_;
  std::string label_;  // task "T" round R: the push of "P", for the log
};

// The coordinator's calls (rounds, members, watches) come from the certificate named
// "coordinator", or from anyone when the aggregator serves plaintext.
// Streams one task's events (WatchTask) to the coordinator. Events are queued and written one at
// a time; the queue is bounded because a watcher that stops reading is ended, not buffered for.
class WatchTaskReactor final : public grpc::ServerWriteReactor<v1::TaskEvent> {
 public:
  WatchTaskReactor(AggregatorCore& core, const std::string& task)
      : core_(core), handle_(std::make_shared<rpc::ReactorHandle<WatchTaskReactor>>(this)) {
    std::weak_ptr<rpc::ReactorHandle<WatchTaskReactor>> weak = handle_;
    const uint64_t watch = core_.Watch(task, [weak](const v1::TaskEvent& event) {
      if (auto handle = weak.lock()) handle->Run([&](WatchTaskReactor& r) { r.Push(event); });
    });
    absl::MutexLock lock(&mu_);
    watch_ = watch;
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    const v1::TaskEvent* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok || cancelled_) {
        writing_ = false;
        finish = !finished_;
        finished_ = true;
      } else if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!finished_ && !writing_) finish = finished_ = true;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    uint64_t watch;
    {
      absl::MutexLock lock(&mu_);
      watch = watch_;
    }
    core_.Unwatch(watch);
    std::shared_ptr<rpc::ReactorHandle<WatchTaskReactor>> handle = std::move(handle_);
    handle->Detach();
  }

 private:
  static constexpr size_t kMaxQueued = 100000;

  void Push(const v1::TaskEvent& event) {
    const v1::TaskEvent* first = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || cancelled_) return;
      if (queue_.size() >= kMaxQueued) {
        // Not reading: end the stream (the coordinator re-watches) rather than grow.
        if (!writing_) finish = finished_ = true;
        cancelled_ = true;
      } else {
        queue_.push_back(event);
        if (!writing_) {
          writing_ = true;
          first = &queue_.front();
        }
      }
    }
    // Outside the lock: gRPC may run OnWriteDone inline.
    if (first != nullptr) StartWrite(first);
    if (finish) Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "watcher too slow"));
  }

  AggregatorCore& core_;
  std::shared_ptr<rpc::ReactorHandle<WatchTaskReactor>> handle_;
  absl::Mutex mu_;
  uint64_t watch_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::TaskEvent> queue_ ABSL_GUARDED_BY(mu_);  // front() is being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

AggregatorServiceImpl::AggregatorServiceImpl(AggregatorServiceOptions options, AggregatorCore& core,
                                             Executor& executor, Executor& transfers,
                                             AggregatorMetrics& metrics, AggregatorClient& parents,
                                             ParentLink& parent_link, DownloadDeltas& downloads)
    : options_(std::move(options)),
      core_(core),
      executor_(executor),
      transfers_(transfers),
      metrics_(metrics),
      parents_(parents),
      parent_link_(parent_link),
      downloads_(downloads) {}

grpc::ServerReadReactor<PutModelRequest>* AggregatorServiceImpl::PutModel(
    grpc::CallbackServerContext* context, aggregator::v1::PutModelResponse* response) {
  return new PutModelReactor(options_, core_, executor_, metrics_, response,
                             rpc::CallerIdentity(*context));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* AggregatorServiceImpl::PushUpdate(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new PushUpdateReactor(core_, executor_, metrics_, parents_, response,
                               rpc::CallerIdentity(*context));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* AggregatorServiceImpl::GetModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  aggregator::v1::GetModelRequest request;
  if (!rpc::ParseRawRequest(*raw_request, &request)) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse GetModelRequest"));
  }
  if (absl::Status s = core_.CheckReader(request.task(), request.peer_id(), request.session_token(),
                                         rpc::CallerIdentity(*context));
      !s.ok()) {
    metrics_.RejectedCounter(RejectReason::kUnauthenticated).Increment();
    return rpc::MakeFailedModelWriteReactor(rpc::ToGrpcStatus(s));
  }
  std::optional<uint64_t> version;
  if (request.has_version()) version = request.version();
  auto snapshot = core_.GetModel(request.task(), version);
  if (!snapshot.ok()) {
    return rpc::MakeFailedModelWriteReactor(rpc::ToGrpcStatus(snapshot.status()));
  }
  absl::StatusOr<ModelSnapshot> base = absl::NotFoundError("no base version asked for");
  if (request.has_base_version()) base = core_.GetModel(request.task(), request.base_version());
  // The peer's own measure of its last download, where it sent one, replaces the one timed here:
  // from the first byte, after any wait for its encoding (DownloadDeltas).
  downloads_.Reported(request.task(), request.peer_id(), request.download_bytes_per_second());
  auto sent = std::make_shared<std::atomic<int64_t>>(0);
  auto* reactor = new rpc::ModelWriteReactor(
      [metrics = &metrics_, downloads = &downloads_, sent, task = request.task(),
       peer = request.peer_id()](uint64_t bytes, bool completed) {
        metrics->bytes_sent.Increment(static_cast<double>(bytes));
        if (completed)
          downloads->Downloaded(task, peer, bytes, absl::Now() - absl::FromUnixNanos(*sent));
      });
  downloads_.Serve(request.task(), request.peer_id(), *snapshot, base,
                   [reactor, sent](std::shared_ptr<const tensor::EncodedModel> payload,
                                   const common::v1::ModelMeta& meta) {
                     *sent = absl::ToUnixNanos(absl::Now());
                     reactor->Start(std::move(payload), meta);
                   });
  return reactor;
}

grpc::ServerUnaryReactor* AggregatorServiceImpl::OpenRound(
    grpc::CallbackServerContext* context, const aggregator::v1::OpenRoundRequest* request,
    aggregator::v1::OpenRoundResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCoordinator(*context); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  const v1::ParentRound& parent = request->parent();
  if (!parent.address().empty() && !core_.GetModel(request->task(), request->base_version()).ok()) {
    // A child's round on a version it does not hold: the model comes down from the parent first
    // (a transfer, on the transfer pool).
    const absl::Time deadline = CallDeadline(*context);
    if (!transfers_.TrySubmit([this, reactor, request, deadline] {
          absl::Status s =
              FetchFromParent(request->task(), request->base_version(), request->parent(),
                              absl::StrCat("round ", request->round(), " of task '",
                                           request->task(), "': fetching base version"),
                              deadline);
          if (s.ok()) s = core_.OpenRound(OpenRoundParams::From(*request));
          reactor->Finish(rpc::ToGrpcStatus(s));
        })) {
      reactor->Finish(Busy());
    }
    return reactor;
  }
  reactor->Finish(rpc::ToGrpcStatus(core_.OpenRound(OpenRoundParams::From(*request))));
  return reactor;
}

grpc::ServerUnaryReactor* AggregatorServiceImpl::OpenBuffer(
    grpc::CallbackServerContext* context, const aggregator::v1::OpenBufferRequest* request,
    aggregator::v1::OpenBufferResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCoordinator(*context); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  const v1::ParentRound& parent = request->parent();
  if (!parent.address().empty() && !core_.GetModel(request->task(), request->base_version()).ok()) {
    // A tree node's buffer on a version it does not hold: the model comes down from the parent
    // first (a transfer, on the transfer pool), as for a child's round.
    const absl::Time deadline = CallDeadline(*context);
    if (!transfers_.TrySubmit([this, reactor, request, deadline] {
          absl::Status s = FetchFromParent(
              request->task(), request->base_version(), request->parent(),
              absl::StrCat("the buffer of task '", request->task(), "': fetching base version"),
              deadline);
          if (s.ok()) s = core_.OpenBuffer(OpenBufferParams::From(*request));
          reactor->Finish(rpc::ToGrpcStatus(s));
        })) {
      reactor->Finish(Busy());
    }
    return reactor;
  }
  // Bookkeeping only (no pass over a model): answered in the reaction, as OpenRound.
  reactor->Finish(rpc::ToGrpcStatus(core_.OpenBuffer(OpenBufferParams::From(*request))));
  return reactor;
}

grpc::ServerUnaryReactor* AggregatorServiceImpl::CloseRound(
    grpc::CallbackServerContext* context, const aggregator::v1::CloseRoundRequest* request,
    aggregator::v1::CloseRoundResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCoordinator(*context); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  // Applying the round's aggregation is (at least) a pass over the model: executor work. A
  // child's round sends its partial sum to its parent instead, within the call's deadline
  // (at most 5 minutes): a transfer, on the transfer pool.
  const absl::Time deadline = CallDeadline(*context);
  const v1::ParentRound parent = core_.ParentOf(request->task(), request->round());
  const bool submitted =
      parent.address().empty()
          ? executor_.TrySubmit([this, reactor, request, response] {
              auto result = core_.CloseRound(request->task(), request->round());
              if (result.ok()) *response = result->ToProto();
              reactor->Finish(rpc::ToGrpcStatus(result.status()));
            })
          : transfers_.TrySubmit([this, reactor, request, response, parent, deadline] {
              auto forwarded = CloseChildRound(request->task(), request->round(), parent, deadline);
              if (forwarded.ok()) *response = *std::move(forwarded);
              reactor->Finish(rpc::ToGrpcStatus(forwarded.status()));
            });
  if (!submitted) reactor->Finish(Busy());
  return reactor;
}

grpc::ServerUnaryReactor* AggregatorServiceImpl::ReleaseTask(
    grpc::CallbackServerContext* context, const aggregator::v1::ReleaseTaskRequest* request,
    aggregator::v1::ReleaseTaskResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::Status s = CheckCoordinator(*context);
  if (s.ok()) {
    if (std::optional<uint64_t> newest = core_.ReleaseTask(request->task())) {
      response->set_newest_version(*newest);
    }
    downloads_.Release(request->task());
  }
  reactor->Finish(rpc::ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* AggregatorServiceImpl::SetMembers(
    grpc::CallbackServerContext* context, const aggregator::v1::SetMembersRequest* request,
    aggregator::v1::SetMembersResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCoordinator(*context); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  std::map<std::string, std::string> tokens(request->session_tokens().begin(),
                                            request->session_tokens().end());
  std::set<std::string> members;
  for (const auto& [peer, token] : tokens) members.insert(peer);
  downloads_.KeepPeers(request->task(), members);
  core_.SetMembers(request->task(), std::move(tokens));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::TaskEvent>* AggregatorServiceImpl::WatchTask(
    grpc::CallbackServerContext* context, const v1::WatchTaskRequest* request) {
  if (absl::Status s = CheckCoordinator(*context); !s.ok()) {
    class Refused final : public grpc::ServerWriteReactor<v1::TaskEvent> {
     public:
      explicit Refused(const absl::Status& s) { Finish(rpc::ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Refused(s);
  }
  return new WatchTaskReactor(core_, request->task());
}

}  // namespace shoal::aggregator
