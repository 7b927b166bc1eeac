#pragma once

// One peer's Session with a CoordinatorCore in this process: the core's events go straight to
// the peer's PeerAgent (as a PeerSink), the agent's messages straight to the core, with no gRPC,
// no sockets and no heartbeats (drive the core with a clock that does not run out of them).
// Thread-safe. Create it with std::make_shared (the core keeps the sink).

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "services/coordinator/coordinator_core.h"
#include "services/peer_agent/peer_agent.h"

namespace shoal::fakes {

class InMemorySession final : public coordinator::PeerSink,
                              public std::enable_shared_from_this<InMemorySession> {
 public:
  explicit InMemorySession(coordinator::CoordinatorCore& core) : core_(core) {}

  // The agent the core's events go to; set before Connect (Welcome is the first event).
  void Attach(peer::PeerAgent* agent) {
    absl::MutexLock lock(&mu_);
    agent_ = agent;
  }
  void Detach() { Attach(nullptr); }

  // Opens the session (what the peer's Hello does).
  absl::Status Connect(const coordinator::v1::Hello& hello) {
    absl::StatusOr<std::string> id = core_.Connect(hello, "", shared_from_this());
    if (!id.ok()) return id.status();
    absl::MutexLock lock(&mu_);
    id_ = *id;
    return absl::OkStatus();
  }

  // The agent's SendFn: the message reaches the core at once. The core's answer to a message
  // that does not fit is its own business (a real session does not report it either).
  absl::Status ToCoordinator(const coordinator::v1::PeerMessage& message) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      // The core sends its first events (Welcome, TaskAssigned) from inside Connect(), before
      // Connect() learns the id: an agent quick to answer them must not send with no id (the
      // core would drop the message, e.g. the DataReport, and the task would wait for this peer
      // forever). A real session knows its id from Welcome, before any answer.
      if (!mu_.AwaitWithTimeout(absl::Condition(this, &InMemorySession::Connected),
                                absl::Seconds(30))) {
        return absl::UnavailableError("the session never connected");
      }
      id = id_;
    }
    (void)core_.OnMessage(id, message);
    return absl::OkStatus();
  }

  // PeerSink: the core's side.
  void Send(const coordinator::v1::CoordinatorEvent& event) override {
    absl::MutexLock lock(&mu_);
    if (agent_ != nullptr) agent_->OnEvent(event);  // only queues
  }
  void Close(const absl::Status&) override {
    absl::MutexLock lock(&mu_);
    if (agent_ != nullptr) agent_->OnDisconnected();
  }

 private:
  bool Connected() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !id_.empty(); }

  coordinator::CoordinatorCore& core_;
  absl::Mutex mu_;
  peer::PeerAgent* agent_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::fakes
