#include "services/aggregator/relay_service.h"

#include <deque>
#include <memory>
#include <optional>
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
    } else if (absl::Status s = hub_.OnReply(token_, std::move(incoming_)); !s.ok()) {
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

// One relayed GetSnapshot: writes the peer's chunks to the caller as they arrive (one write at
// a time, the rest queued; the hub bounds what is queued), then the peer's status.
class RelayedSnapshotReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RelayedSnapshotReactor(RelayHub& hub)
      : hub_(hub), handle_(std::make_shared<rpc::ReactorHandle<RelayedSnapshotReactor>>(this)) {}

  void Start(const peer::v1::GetSnapshotRequest& request) {
    RelayCall call;
    *call.mutable_get_snapshot() = request;
    call.mutable_get_snapshot()->clear_relay_to();
    std::shared_ptr<rpc::ReactorHandle<RelayedSnapshotReactor>> handle = handle_;
    const uint64_t id = hub_.Call(
        request.relay_to(), std::move(call),
        [handle](RelayResult result) {
          handle->Run([&](RelayedSnapshotReactor& r) { r.OnEnd(std::move(result.status)); });
        },
        [handle](std::string chunk) {
          handle->Run([&](RelayedSnapshotReactor& r) { r.OnChunk(std::move(chunk)); });
        });
    uint64_t unreported = 0;
    {
      absl::MutexLock lock(&mu_);
      call_id_ = id;
      std::swap(unreported, unreported_);
    }
    if (unreported > 0) hub_.Sent(id, unreported);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    bool write = false;
    uint64_t id = 0;
    uint64_t sent = 0;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      sent = writing_bytes_;
      id = call_id_;
      if (id == 0) unreported_ += sent;  // Start has not learnt the id yet
      if (!ok) {
        queue_.clear();
        if (!finishing_) finish = grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
      } else if (pending_finish_.has_value()) {
        finish = std::move(pending_finish_);
        pending_finish_.reset();
      } else {
        write = NextLocked();
        if (!write && ended_ && !finishing_) finish = grpc::Status::OK;
      }
      if (finish.has_value()) finishing_ = true;
    }
    if (id != 0) hub_.Sent(id, sent);
    if (write) StartWrite(&message_);
    if (finish.has_value()) Finish(*finish);
  }
  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      id = call_id_;
    }
    if (hub_.Abandon(id)) End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller"));
  }
  void OnDone() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      id = call_id_;
    }
    // A caller gone mid-snapshot: the call stops here too (its later chunks would otherwise be
    // held for nobody); an answered one gives back what it held.
    hub_.Abandon(id);
    handle_->Detach();
  }

 private:
  void OnChunk(std::string chunk) {
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (finishing_ || pending_finish_.has_value()) return;
      queue_.push_back(std::move(chunk));
      write = !writing_ && NextLocked();
    }
    if (write) StartWrite(&message_);
  }
  void OnEnd(absl::Status status) {
    if (status.ok()) {
      bool finish = false;
      {
        absl::MutexLock lock(&mu_);
        ended_ = true;
        finish = !writing_ && queue_.empty() && !finishing_ && !pending_finish_.has_value();
        finishing_ = finishing_ || finish;
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    End(rpc::ToGrpcStatus(status));
  }
  // Finishes with `status` now, or once the write in flight completes; the queue is dropped.
  void End(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_ || pending_finish_.has_value()) return;
      queue_.clear();
      if (writing_) {
        pending_finish_ = std::move(status);
        return;
      }
      finishing_ = true;
    }
    Finish(status);
  }
  // Moves the next queued chunk into message_ for a write; false when the queue is empty.
  bool NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty()) return false;
    writing_bytes_ = queue_.front().size();
    grpc::Slice slice(std::move(queue_.front()));
    queue_.pop_front();
    message_ = grpc::ByteBuffer(&slice, 1);
    writing_ = true;
    return true;
  }

  RelayHub& hub_;
  std::shared_ptr<rpc::ReactorHandle<RelayedSnapshotReactor>> handle_;
  absl::Mutex mu_;
  uint64_t call_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unreported_ ABSL_GUARDED_BY(mu_) = 0;  // sent before Start learnt the call id
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // message_ is being written
  uint64_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;      // the peer's OK end came: finish once written
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called (or is being called)
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);  // after the write in flight
  grpc::ByteBuffer message_;  // the write in flight (writing_)
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
