#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/aggregator/aggregator_metrics.h"
#include "shoal/peer/v1/peer.pb.h"

namespace shoal::aggregator {

// How a relayed call ends, for its caller. A snapshot's chunks went to the call's OnChunk.
struct RelayResult {
  absl::Status status;
  uint64_t bytes = 0;             // GetSnapshot: the chunks' total size
  peer::v1::ProbeResponse probe;  // Probe
};

// The relay's side of peers behind NAT (RelayService): which peer keeps which Relay stream open
// here, and the calls in flight on each. Plain C++: the gRPC reactors (relay_service.h) feed it
// what they read and give it a Stream to write to. Thread-safe; callbacks and Stream methods are
// called without the hub's lock held.
class RelayHub {
 public:
  struct Options {
    size_t max_calls_per_peer = 16;  // more at once: RESOURCE_EXHAUSTED
    // The most of one relayed snapshot the relay may hold: received from the peer and not yet
    // sent on to the caller (Sent). A caller that reads as fast as the peer writes holds a
    // chunk or two; a stalled one fails here instead of growing the relay's memory.
    uint64_t max_call_bytes = uint64_t{1} << 30;
    // The most all the snapshots being relayed may hold together, in the same sense.
    uint64_t max_total_bytes = uint64_t{2} << 30;
  };

  // A relayed peer's stream, as the hub writes to it.
  class Stream {
   public:
    virtual ~Stream() = default;
    virtual void Send(const peer::v1::RelayCall& call) = 0;
    // Ends the stream with `status` (e.g. a newer stream for the same peer replaced it).
    virtual void Close(const absl::Status& status) = 0;
  };
  using Done = std::function<void(RelayResult)>;
  // A snapshot's chunk: a serialized ModelChunk message, ModelMeta first, exactly as the peer
  // sent it (the caller checks the digests; the relay does not parse them).
  using OnChunk = std::function<void(std::string chunk)>;

  RelayHub(Options options, AggregatorMetrics& metrics) : options_(options), metrics_(metrics) {}

  // `stream` is now `peer_id`'s relay: an older stream of that peer is closed (UNAVAILABLE) and
  // its calls fail. Sends the stream its call_id 0 (attached) before any call can reach it.
  // Returns the stream's token.
  uint64_t Attach(const std::string& peer_id, std::shared_ptr<Stream> stream)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The stream of `token` ended: its calls fail UNAVAILABLE. Unknown tokens are ignored.
  void Detach(uint64_t token) ABSL_LOCKS_EXCLUDED(mu_);
  // Passes `call` (its call_id is set here) to `peer_id`'s stream. A snapshot's chunks go to
  // `on_chunk` as they arrive, in order, and the relay holds each until the caller says it was
  // sent on (Sent) or lets the call go (Abandon). `done` runs exactly once, after the chunks,
  // possibly before Call returns, unless Abandon() removed the call first: NOT_FOUND when the peer
  // keeps no relay stream here, RESOURCE_EXHAUSTED when it has too many calls in flight (or
  // the relay would hold more of its snapshot than max_call_bytes, or than what
  // max_total_bytes leaves), UNAVAILABLE when its stream ends first, else the peer's answer.
  // Returns the call's id. Callbacks run without the hub's lock held.
  uint64_t Call(const std::string& peer_id, peer::v1::RelayCall call, Done done,
                OnChunk on_chunk = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // The caller sent `bytes` of the call's chunks on: the relay no longer holds them.
  void Sent(uint64_t call_id, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The caller is done with the call (gone, or answered and finished): forgets it if it is
  // still in flight (its later chunks are dropped) and gives back whatever of its chunks the
  // relay still held. True when `done` has not run and never will. Idempotent; unknown ids
  // are ignored.
  bool Abandon(uint64_t call_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A message read from the stream of `token` (after its `open`); a chunk is moved on, not
  // copied. An error means the peer broke the protocol (a reply for a call of another kind; a
  // snapshot over the bounds is only the call's failure); the caller closes the stream with it.
  absl::Status OnReply(uint64_t token, peer::v1::RelayReply reply) ABSL_LOCKS_EXCLUDED(mu_);

  size_t streams() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct PendingCall {
    uint64_t token = 0;  // the stream it went to
    bool snapshot = false;
    Done done;
    OnChunk on_chunk;
    RelayResult result;
  };
  struct Attached {
    std::string peer_id;
    std::shared_ptr<Stream> stream;
    size_t calls = 0;
    // Until its call_id 0 (attached) is sent: the calls made meanwhile, sent right after it.
    bool attaching = true;
    std::vector<peer::v1::RelayCall> waiting;
  };
  // Removes `id` and returns its callback and result (under mu_); the caller runs it unlocked.
  // A failed call is released too (the caller sends nothing more of it).
  std::pair<Done, RelayResult> TakeLocked(uint64_t id, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailStreamCallsLocked(uint64_t token, const absl::Status& status,
                             std::vector<std::pair<Done, RelayResult>>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  AggregatorMetrics& metrics_;
  mutable absl::Mutex mu_;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_call_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // the sum of held_
  // Snapshot bytes received and not yet sent on, by call id: pending calls, and calls answered
  // whose caller is still sending (until Abandon).
  std::map<uint64_t, uint64_t> held_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Attached> streams_ ABSL_GUARDED_BY(mu_);     // by token
  std::map<std::string, uint64_t> by_peer_ ABSL_GUARDED_BY(mu_);  // peer id -> token
  std::map<uint64_t, PendingCall> calls_ ABSL_GUARDED_BY(mu_);    // by call id
};

}  // namespace shoal::aggregator
