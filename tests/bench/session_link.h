#pragma once

// How a light peer's session reaches the coordinator: a gRPC stream (over TCP or an in-process
// channel), or the coordinator's core called directly, with no gRPC between them (the
// coordinator's own cost per peer, for scripts/bench-coordinator --direct).

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "libs/common/executor.h"
#include "services/coordinator/coordinator_core.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"

namespace shoal::bench {

// What a link tells its peer. on_event runs for one event at a time, in the order the
// coordinator sent them; on_done runs once, after the last on_event.
struct LinkCallbacks {
  std::function<void(const coordinator::v1::CoordinatorEvent&)> on_event;
  std::function<void(const absl::Status&)> on_done;
};

// One session. Thread-safe after Start.
class SessionLink {
 public:
  virtual ~SessionLink() = default;
  // Opens the session with its first message. Once.
  virtual void Start(coordinator::v1::PeerMessage hello) = 0;
  // Queues a message for the coordinator; dropped once the session ended.
  virtual void Send(coordinator::v1::PeerMessage message) = 0;
  // Ends the session (on_done follows) when nothing outside the callbacks sends any more.
  virtual void Stop() = 0;
  // Waits for on_done; returns at once when the session never started.
  virtual void WaitDone() = 0;
};

// A Session stream of `channel` (one queued write in flight at a time, as shoal-peer's).
std::unique_ptr<SessionLink> MakeGrpcLink(std::shared_ptr<grpc::Channel> channel,
                                          LinkCallbacks callbacks);

// A session that calls `core` directly (Connect, OnMessage, Disconnect) and gets its events
// through a PeerSink whose Send posts them to `delivery`, which must run what it is given in
// order (one thread: the work a transport's receiving threads would do); the unit tests'
// InMemorySession (tests/fakes/) does the same for a PeerAgent, whose OnEvent queues by itself.
// Events the delivery refuses are counted in `*lost`.
std::unique_ptr<SessionLink> MakeDirectLink(coordinator::CoordinatorCore& core, Executor& delivery,
                                            std::atomic<int64_t>* lost, LinkCallbacks callbacks);

}  // namespace shoal::bench
