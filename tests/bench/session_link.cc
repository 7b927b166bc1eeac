#include "tests/bench/session_link.h"

#include <atomic>
#include <deque>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "libs/rpc/status.h"

namespace shoal::bench {

namespace v1 = coordinator::v1;

namespace {

// Writes go through a queue, one in flight at a time, as the coordinator's own reactor does.
class GrpcLink final : public SessionLink,
                       public grpc::ClientBidiReactor<v1::PeerMessage, v1::CoordinatorEvent> {
 public:
  GrpcLink(std::shared_ptr<grpc::Channel> channel, LinkCallbacks callbacks)
      : channel_(std::move(channel)),
        stub_(v1::SessionService::NewStub(channel_)),
        callbacks_(std::move(callbacks)) {}

  void Start(v1::PeerMessage hello) override {
    stub_->async()->Session(&context_, this);
    Send(std::move(hello));
    StartRead(&event_);
    // Heartbeats and the peer's executor start writes from outside the reactions: the hold keeps
    // the call (and OnDone) from finishing under such a write until Stop().
    AddHold();
    started_ = true;
    StartCall();
  }

  void Send(v1::PeerMessage message) override {
    absl::MutexLock lock(&mu_);
    if (failed_ || done_) return;
    queue_.push_back(std::move(message));
    if (writing_) return;
    writing_ = true;
    StartWrite(&queue_.front());
  }

  void Stop() override {
    context_.TryCancel();
    if (started_) RemoveHold();
  }

  void WaitDone() override {
    if (!started_) return;
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    callbacks_.on_event(event_);
    StartRead(&event_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (!ok) {
      queue_.clear();
      failed_ = true;
    }
    if (queue_.empty()) {
      writing_ = false;
    } else {
      StartWrite(&queue_.front());
    }
  }

  void OnDone(const grpc::Status& status) override {
    callbacks_.on_done(rpc::FromGrpcStatus(status));
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SessionService::Stub> stub_;
  const LinkCallbacks callbacks_;
  grpc::ClientContext context_;
  v1::CoordinatorEvent event_;  // only the read path touches it
  bool started_ = false;        // set by Start, read by Stop and WaitDone (the fleet's thread)

  absl::Mutex mu_;
  std::deque<v1::PeerMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// The state of one direct session, shared by the link, the sink the core holds (possibly past
// the link) and the work posted to the delivery.
class DirectSession : public std::enable_shared_from_this<DirectSession> {
 public:
  DirectSession(coordinator::CoordinatorCore& core, Executor& delivery, std::atomic<int64_t>* lost,
                LinkCallbacks callbacks)
      : core_(core), delivery_(delivery), lost_(lost), callbacks_(std::move(callbacks)) {}

  // From the core (its outbox: the core must not be called back from here).
  void Event(const v1::CoordinatorEvent& event) {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    Post([self = shared_from_this(), event] { self->Deliver(event); });
  }

  // Ends the session once: disconnects it from the core and runs on_done, on the delivery,
  // behind the events posted before.
  void End(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      // Posted under mu_, so behind every event posted before.
      if (delivery_.TrySubmit([self = shared_from_this(), status] { self->Finish(status); })) {
        return;
      }
    }
    ++*lost_;
    Finish(status);  // the delivery is full or shut down: finish here
  }

  void Start(const v1::PeerMessage& hello, const coordinator::PeerSink* sink,
             std::shared_ptr<coordinator::PeerSink> held) {
    {
      absl::MutexLock lock(&mu_);
      sink_ = sink;
      started_ = true;
    }
    // Not under mu_: the core may send Welcome before Connect returns.
    absl::StatusOr<std::string> id = core_.Connect(hello.hello(), "", std::move(held));
    if (!id.ok()) {
      End(id.status());
      return;
    }
    absl::MutexLock lock(&mu_);
    peer_id_ = *id;
  }

  void Send(const v1::PeerMessage& message) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      if (ended_ || peer_id_.empty()) return;
      id = peer_id_;
    }
    // Refusals are the coordinator's to count and log, as for a stream.
    core_.OnMessage(id, message).IgnoreError();
  }

  void WaitDone() {
    absl::MutexLock lock(&mu_);
    if (!started_) return;
    mu_.Await(absl::Condition(&done_));
  }

 private:
  void Post(std::function<void()> fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!delivery_.TrySubmit(std::move(fn))) ++*lost_;
  }

  void Deliver(const v1::CoordinatorEvent& event) {
    if (event.kind_case() == v1::CoordinatorEvent::kWelcome) {
      absl::MutexLock lock(&mu_);
      peer_id_ = event.welcome().peer_id();
    }
    callbacks_.on_event(event);
  }

  void Finish(const absl::Status& status) {
    std::string id;
    const coordinator::PeerSink* sink = nullptr;
    {
      absl::MutexLock lock(&mu_);
      id = peer_id_;
      sink = sink_;
    }
    if (!id.empty()) core_.Disconnect(id, sink);
    callbacks_.on_done(status);
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

  coordinator::CoordinatorCore& core_;
  Executor& delivery_;
  std::atomic<int64_t>* const lost_;
  const LinkCallbacks callbacks_;
  absl::Mutex mu_;
  const coordinator::PeerSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string peer_id_ ABSL_GUARDED_BY(mu_);  // from Connect, or Welcome if that comes first
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// What the core holds for a direct session.
class DirectSink final : public coordinator::PeerSink {
 public:
  explicit DirectSink(std::shared_ptr<DirectSession> session) : session_(std::move(session)) {}
  void Send(const v1::CoordinatorEvent& event) override { session_->Event(event); }
  void Close(const absl::Status& status) override { session_->End(status); }

 private:
  const std::shared_ptr<DirectSession> session_;
};

class DirectLink final : public SessionLink {
 public:
  explicit DirectLink(std::shared_ptr<DirectSession> session) : session_(std::move(session)) {}

  void Start(v1::PeerMessage hello) override {
    auto sink = std::make_shared<DirectSink>(session_);
    const coordinator::PeerSink* raw = sink.get();
    session_->Start(hello, raw, std::move(sink));
  }
  void Send(v1::PeerMessage message) override { session_->Send(message); }
  void Stop() override { session_->End(absl::CancelledError("the peer stopped")); }
  void WaitDone() override { session_->WaitDone(); }

 private:
  const std::shared_ptr<DirectSession> session_;
};

}  // namespace

std::unique_ptr<SessionLink> MakeGrpcLink(std::shared_ptr<grpc::Channel> channel,
                                          LinkCallbacks callbacks) {
  return std::make_unique<GrpcLink>(std::move(channel), std::move(callbacks));
}

std::unique_ptr<SessionLink> MakeDirectLink(coordinator::CoordinatorCore& core, Executor& delivery,
                                            std::atomic<int64_t>* lost, LinkCallbacks callbacks) {
  return std::make_unique<DirectLink>(
      std::make_shared<DirectSession>(core, delivery, lost, std::move(callbacks)));
}

}  // namespace shoal::bench
