#include "services/coordinator/session_service.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/capacity/upload_probe.h"
#include "libs/common/log.h"
#include "libs/rpc/queued_bidi_reactor.h"
#include "libs/rpc/reactor_handle.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"

namespace shoal::coordinator {
namespace {

constexpr size_t kMaxQueuedEvents = 10000;

// One peer's stream (writes queued: rpc::QueuedBidiReactor). The core holds it through the
// PeerSink interface (a shared_ptr to a small forwarding object), which may outlive the reactor
// and then drops events.
class SessionReactor final : public rpc::QueuedBidiReactor<v1::PeerMessage, v1::CoordinatorEvent> {
 public:
  SessionReactor(CoordinatorCore& core, std::string peer_address, std::string identity)
      : QueuedBidiReactor(kMaxQueuedEvents, "too many undelivered events"),
        core_(core),
        peer_address_(std::move(peer_address)),
        identity_(std::move(identity)),
        sink_(std::make_shared<Sink>(this)) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the peer half-closed or the call broke
      Close(absl::OkStatus());
      return;
    }
    if (peer_id_.empty()) {
      if (incoming_.kind_case() != v1::PeerMessage::kHello) {
        Close(absl::InvalidArgumentError("the first message of a session must be hello"));
        return;
      }
      absl::StatusOr<std::string> id = core_.Connect(incoming_.hello(), identity_, sink_);
      if (!id.ok()) {
        LogWarning("session from ", peer_address_, " refused: ", id.status().message());
        Close(id.status());
        return;
      }
      peer_id_ = *id;
    } else {
      absl::Status s = core_.OnMessage(peer_id_, incoming_);
      if (!s.ok()) LogWarning("peer ", peer_id_, ": ", s.message());
    }
    if (closing()) return;
    StartRead(&incoming_);
  }

  void OnDone() override {
    if (!peer_id_.empty()) core_.Disconnect(peer_id_, sink_.get());
    std::shared_ptr<Sink> sink = sink_;  // keeps the sink alive while it deletes this reactor
    sink->handle.Detach();
  }

 private:
  // The core's view of this stream; forwards while the reactor exists.
  class Sink final : public PeerSink {
   public:
    explicit Sink(SessionReactor* reactor) : handle(reactor) {}
    void Send(const v1::CoordinatorEvent& event) override {
      handle.Run([&](SessionReactor& r) { r.Send(event); });
    }
    void Close(const absl::Status& status) override {
      handle.Run([&](SessionReactor& r) { r.Close(status); });
    }
    rpc::ReactorHandle<SessionReactor> handle;
  };

  void OnOverflow() override {
    LogWarning("peer ", peer_id_, " does not read its events; closing its session");
  }

  CoordinatorCore& core_;
  const std::string peer_address_;
  const std::string identity_;  // the client certificate's common name; "" when plaintext
  std::shared_ptr<Sink> sink_;
  std::string peer_id_;  // set by the first read; only the read path touches it before OnDone
  v1::PeerMessage incoming_;
};

// One timed upload: counts the payload bytes and answers when the caller half-closes. At most
// kMaxRunning at once; each holds one chunk at a time.
class UploadProbeReactor final : public grpc::ServerReadReactor<v1::UploadProbe> {
 public:
  static constexpr int kMaxRunning = 4;

  UploadProbeReactor(std::atomic<int>& running, v1::UploadProbeResult* result)
      : running_(running), result_(result) {
    if (running_.fetch_add(1) >= kMaxRunning) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "MeasureUpload: four measurements are running; try again later"));
      return;
    }
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    const auto now = std::chrono::steady_clock::now();
    if (!ok) {  // the caller half-closed (or the call broke: Finish then goes nowhere)
      result_->set_bytes(bytes_);
      result_->set_receive_micros(
          bytes_ == 0
              ? 0
              : std::chrono::duration_cast<std::chrono::microseconds>(now - first_).count());
      Finish(grpc::Status::OK);
      return;
    }
    if (bytes_ == 0) first_ = now;
    const uint64_t n = chunk_.payload().size();
    if (n > capacity::kMaxUploadProbeChunk || bytes_ + n > capacity::kMaxUploadProbeBytes) {
      Finish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("MeasureUpload: at most ", capacity::kMaxUploadProbeBytes,
                       " bytes in chunks of at most ", capacity::kMaxUploadProbeChunk, " bytes")));
      return;
    }
    bytes_ += n;
    StartRead(&chunk_);
  }

  void OnDone() override {
    running_.fetch_sub(1);
    delete this;
  }

 private:
  std::atomic<int>& running_;
  v1::UploadProbeResult* result_;
  v1::UploadProbe chunk_;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point first_;
};

}  // namespace

grpc::ServerReadReactor<v1::UploadProbe>* SessionServiceImpl::MeasureUpload(
    grpc::CallbackServerContext* context, v1::UploadProbeResult* result) {
  return new UploadProbeReactor(measuring_, result);
}

grpc::ServerUnaryReactor* SessionServiceImpl::ListAggregators(
    grpc::CallbackServerContext* context, const v1::ListAggregatorsRequest* /*request*/,
    v1::ListAggregatorsResponse* response) {
  for (std::string& address : core_.AggregatorsToMeasure()) {
    response->add_addresses(std::move(address));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerBidiReactor<v1::PeerMessage, v1::CoordinatorEvent>* SessionServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(core_, context->peer(), rpc::CallerIdentity(*context));
}

}  // namespace shoal::coordinator
