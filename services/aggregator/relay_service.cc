#include "services/aggregator/relay_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/queued_bidi_reactor.h"
#include "libs/rpc/reactor_handle.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"

namespace shoal::aggregator {
namespace {

using peer::v1::RelayCall;
using peer::v1::RelayReply;

// One relayed peer's stream (writes queued: rpc::QueuedBidiReactor). The hub holds it through a
// Sink that outlives the reactor and then drops what it is given.
class RelayStreamReactor final : public rpc::QueuedBidiReactor<RelayReply, RelayCall> {
 public:
  RelayStreamReactor(RelayHub& hub, std::string identity)
      : hub_(hub), identity_(std::move(identity)), sink_(std::make_shared<Sink>(this)) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the peer half-closed or the call broke
      Close(absl::OkStatus());
      return;
    }
    if (token_ == 0) {
      if (absl::Status s = Open(); !s.ok()) {
        LogWarning("relay stream refused: ", s.message());
        Close(s);
        return;
      }
    } else if (absl::Status s = hub_.OnReply(token_, incoming_); !s.ok()) {
      LogWarning("relay stream of peer '", EscapeBytes(peer_id_), "': ", s.message());
      Close(s);
      return;
    }
    if (closing()) return;
    StartRead(&incoming_);
  }

  void OnDone() override {
    if (token_ != 0) {
      hub_.Detach(token_);
      LogInfo("peer '", EscapeBytes(peer_id_), "' is no longer relayed here");
    }
    std::shared_ptr<Sink> sink = sink_;  // keeps the sink alive while it deletes this reactor
    sink->handle.Detach();
  }

 private:
  class Sink final : public RelayHub::Stream {
   public:
    explicit Sink(RelayStreamReactor* reactor) : handle(reactor) {}
    void Send(const RelayCall& call) override {
      handle.Run([&](RelayStreamReactor& r) { r.Send(call); });
    }
    void Close(const absl::Status& status) override {
      handle.Run([&](RelayStreamReactor& r) { r.Close(status); });
    }
    rpc::ReactorHandle<RelayStreamReactor> handle;
  };

  absl::Status Open() {
    if (incoming_.reply_case() != RelayReply::kOpen) {
      return absl::InvalidArgumentError("the first message of a relay stream must be open");
    }
    const std::string& id = incoming_.open().peer_id();
    if (id.empty()) return absl::InvalidArgumentError("open: the peer id is empty");
    if (!identity_.empty() && id != identity_) {
      return absl::PermissionDeniedError(absl::StrCat("open: peer '", EscapeBytes(id),
                                                      "' called with the certificate of '",
                                                      EscapeBytes(identity_), "'"));
    }
    peer_id_ = id;
    token_ = hub_.Attach(peer_id_, sink_);
    LogInfo("relaying for peer '", EscapeBytes(peer_id_), "'");
    return absl::OkStatus();
  }

  RelayHub& hub_;
  const std::string identity_;  // the client certificate's common name; "" when plaintext
  std::shared_ptr<Sink> sink_;
  // Set by the first read; only the read path and OnDone touch them.
  std::string peer_id_;
  uint64_t token_ = 0;
  RelayReply incoming_;
};

// Finishes a call exactly once, whichever of the hub's answer and the caller's cancellation
// comes first.
class FinishOnce {
 public:
  bool Take() {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }

 private:
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// One relayed GetSnapshot: waits for the hub's answer, then writes its chunks one by one.
class RelayedSnapshotReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RelayedSnapshotReactor(RelayHub& hub)
      : hub_(hub), handle_(std::make_shared<rpc::ReactorHandle<RelayedSnapshotReactor>>(this)) {}

  void Start(const peer::v1::GetSnapshotRequest& request) {
    RelayCall call;
    *call.mutable_get_snapshot() = request;
    call.mutable_get_snapshot()->clear_relay_to();
    std::shared_ptr<rpc::ReactorHandle<RelayedSnapshotReactor>> handle = handle_;
    call_id_ = hub_.Call(request.relay_to(), std::move(call), [handle](RelayResult result) {
      handle->Run([&](RelayedSnapshotReactor& r) { r.Deliver(std::move(result)); });
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      if (once_.Take()) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
      return;
    }
    WriteNext();
  }
  void OnCancel() override {
    if (hub_.Abandon(call_id_) && once_.Take()) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller"));
    }
  }
  void OnDone() override { handle_->Detach(); }

 private:
  void Deliver(RelayResult result) {
    if (!result.status.ok()) {
      if (once_.Take()) Finish(rpc::ToGrpcStatus(result.status));
      return;
    }
    chunks_ = std::move(result.chunks);
    WriteNext();
  }

  void WriteNext() {
    if (next_ == chunks_.size()) {
      if (once_.Take()) Finish(grpc::Status::OK);
      return;
    }
    grpc::Slice slice(std::move(chunks_[next_++]));
    message_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&message_);
  }

  RelayHub& hub_;
  std::shared_ptr<rpc::ReactorHandle<RelayedSnapshotReactor>> handle_;
  uint64_t call_id_ = 0;
  FinishOnce once_;
  // Written by Deliver, then only by write completions (one at a time).
  std::vector<std::string> chunks_;
  size_t next_ = 0;
  grpc::ByteBuffer message_;
};

// One relayed Probe.
class RelayedProbeReactor final : public grpc::ServerUnaryReactor {
 public:
  RelayedProbeReactor(RelayHub& hub, peer::v1::ProbeResponse* response)
      : hub_(hub),
        response_(response),
        handle_(std::make_shared<rpc::ReactorHandle<RelayedProbeReactor>>(this)) {}

  void Start(const peer::v1::ProbeRequest& request) {
    RelayCall call;
    *call.mutable_probe() = request;
    call.mutable_probe()->clear_relay_to();
    std::shared_ptr<rpc::ReactorHandle<RelayedProbeReactor>> handle = handle_;
    call_id_ = hub_.Call(request.relay_to(), std::move(call), [handle](RelayResult result) {
      handle->Run([&](RelayedProbeReactor& r) {
        if (!r.once_.Take()) return;
        if (result.status.ok()) *r.response_ = result.probe;
        r.Finish(rpc::ToGrpcStatus(result.status));
      });
    });
  }
  void OnCancel() override {
    if (hub_.Abandon(call_id_) && once_.Take()) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller"));
    }
  }
  void OnDone() override { handle_->Detach(); }

 private:
  RelayHub& hub_;
  peer::v1::ProbeResponse* const response_;
  std::shared_ptr<rpc::ReactorHandle<RelayedProbeReactor>> handle_;
  uint64_t call_id_ = 0;
  FinishOnce once_;
};

grpc::Status NoRelayTo(const char* method) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat(method,
                                   " at an aggregator: this is a relay, and relay_to must name "
                                   "the peer the call is for"));
}

}  // namespace

grpc::ServerBidiReactor<RelayReply, RelayCall>* RelayServiceImpl::Relay(
    grpc::CallbackServerContext* context) {
  return new RelayStreamReactor(hub_, rpc::CallerIdentity(*context));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RelayPeerServiceImpl::GetSnapshot(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  peer::v1::GetSnapshotRequest request;
  if (!rpc::ParseRawRequest(*raw_request, &request)) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse GetSnapshotRequest"));
  }
  if (request.relay_to().empty()) return rpc::MakeFailedModelWriteReactor(NoRelayTo("GetSnapshot"));
  auto* reactor = new RelayedSnapshotReactor(hub_);
  reactor->Start(request);
  return reactor;
}

grpc::ServerUnaryReactor* RelayPeerServiceImpl::Probe(grpc::CallbackServerContext* context,
                                                      const peer::v1::ProbeRequest* request,
                                                      peer::v1::ProbeResponse* response) {
  if (request->relay_to().empty()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(NoRelayTo("Probe"));
    return reactor;
  }
  auto* reactor = new RelayedProbeReactor(hub_, response);
  reactor->Start(*request);
  return reactor;
}

}  // namespace shoal::aggregator
